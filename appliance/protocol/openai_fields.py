"""The value types OpenAI request bodies are made of, as pydantic types: no type coercion (a bool is not
a number, "5" is not an integer), though an integer may be written 4.0, and numbers are finite. Each is a
static `Annotated` alias, so that mypy reads the field types as they are validated.

A union whose member a function picks (`Annotated[Union[Annotated[A, member("a")], ...], picked_by(pick)]`)
makes an error about the member the client meant (`<tag>` names stay out of error paths:
protocol/validation.py); `OneOrList[One, Many]` is the common "a string or a list of ..." one.
"""
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, TypeVar, Union

from pydantic import (BeforeValidator, ConfigDict, Discriminator, Field, GetCoreSchemaHandler,
                      GetJsonSchemaHandler, Strict, Tag)
from pydantic_core import CoreSchema, core_schema
from typing_extensions import Annotated

from appliance.field_rules import whole_as_int
from appliance.protocol.validation import field_error

STRICT = ConfigDict(extra="forbid", strict=True)
LENIENT = ConfigDict(extra="ignore", strict=True)  # OpenAI objects whose other keys are ignored
JsonSchema = Dict[str, Any]  # a JSON schema (fits pydantic's `json_schema_extra`)


Int = TypeVar("Int", bound=int)
# An integer, 4.0 taken as 4; bounds go inside (`Integral[Annotated[int, Field(ge=1)]]`): placed after the
# BeforeValidator, pydantic writes them into the JSON schema as `ge`, not `minimum`.
Integral = Annotated[Int, Strict(), BeforeValidator(whole_as_int)]
Integer = Integral[int]
Number = Annotated[float, Strict(), Field(allow_inf_nan=False)]
TokenId = Integral[Annotated[int, Field(ge=0)]]
Text = Annotated[str, Strict(), Field(min_length=1)]


def member(name: str) -> Tag:
    """A union member's tag, named as its union's `picked_by` function names it."""
    return Tag(f"<{name}>")


def picked_by(pick: Callable[[Any], Optional[str]]) -> Discriminator:
    """A union's discriminator: `pick(value)` names the `member` to validate against (None: none fits, the
    error names the field)."""
    return Discriminator(lambda value: _tag(pick(value)))


def one_or_list(value: Any) -> Optional[str]:
    """The pick of "a string or a list of ..." fields: members named `one` and `list`."""
    return "one" if isinstance(value, str) else "list" if isinstance(value, list) else None


def _tag(name: Optional[str]) -> Optional[str]:
    return None if name is None else f"<{name}>"


One = TypeVar("One")
Many = TypeVar("Many")
OneOrList = Annotated[Union[Annotated[One, member("one")], Annotated[Many, member("list")]], picked_by(one_or_list)]


def engine_range(**bounds: float) -> Any:
    """JSON-schema bounds the engine's `SamplingParams` enforces (its errors name the field, and it checks
    the pipeline's own defaults too): documented here, checked there."""
    extra: JsonSchema = dict(bounds)
    return Field(json_schema_extra=extra)


@dataclass(frozen=True)
class Neutral:
    """Metadata of a field OpenAI clients send that is accepted only at its neutral `value` (or null):
    `Annotated[Optional[Number], Neutral(0, "why")]`."""
    value: Any
    hint: str

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchema:
        return {**handler(schema), "enum": [self.value, None]}

    def _check(self, given: Any) -> Any:
        if given is not None and given != self.value:
            raise field_error(f"{given!r}; allowed: {self.value!r} only ({self.hint})")
        return given
