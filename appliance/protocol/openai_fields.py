"""The value types OpenAI request bodies are made of, as pydantic types: no type coercion (a bool is not
a number, "5" is not an integer), though an integer may be written 4.0, and numbers are finite. `either` builds a
union whose member a function picks, so an error is about the
member the client meant (`<tag>` names stay out of error paths: protocol/validation.py).
"""
from typing import Any, Callable, Optional, Union

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Discriminator, Field, Strict, Tag
from typing_extensions import Annotated

from appliance.protocol.validation import field_error

STRICT = ConfigDict(extra="forbid", strict=True)
LENIENT = ConfigDict(extra="ignore", strict=True)  # OpenAI objects whose other keys are ignored


def _integral(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def integer(**bounds: int) -> Any:
    """An integer within `bounds` (Field's ge, le); 4.0 is taken as 4."""
    return Annotated[int, Strict(), Field(**bounds), BeforeValidator(_integral)]


Integer = integer()
Number = Annotated[float, Strict(), Field(allow_inf_nan=False)]
TokenId = integer(ge=0)
Text = Annotated[str, Strict(), Field(min_length=1)]


def either(pick: Callable[[Any], Optional[str]], **members: Any) -> Any:
    """A union of `members` (tag name -> type); `pick(value)` names the member to validate against (None:
    none fits, the error names the field)."""
    tagged = tuple(Annotated[kind, Tag(f"<{name}>")] for name, kind in members.items())
    return Annotated[Union[tagged], Discriminator(lambda value: _tag(pick(value)))]


def one_or_list(value: Any) -> Optional[str]:
    """`either`'s pick for "a string or a list of ..." fields: members named `one` and `list`."""
    return "one" if isinstance(value, str) else "list" if isinstance(value, list) else None


def _tag(name: Optional[str]) -> Optional[str]:
    return None if name is None else f"<{name}>"


def engine_range(**bounds: float) -> Any:
    """JSON-schema bounds the engine's `SamplingParams` enforces (its errors name the field, and it checks
    the pipeline's own defaults too): documented here, checked there."""
    return Field(json_schema_extra=bounds)


def neutral(kind: Any, value: Any, hint: str) -> Any:
    """A field OpenAI clients send that is accepted only at its neutral `value` (or null)."""
    def check(given: Any) -> Any:
        if given is not None and given != value:
            raise field_error(f"{given!r}; allowed: {value!r} only ({hint})")
        return given

    return Annotated[Optional[kind], AfterValidator(check), Field(json_schema_extra={"enum": [value, None]})]
