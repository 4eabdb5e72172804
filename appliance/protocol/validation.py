"""A pydantic `ValidationError` as our `InputError`, in one place: every problem, each message starting
with the field's path (`data.data_format: 's3'; allowed: b64_json, url, path`, in a batch file
`line 3: body.temperature: expected a number, got 'hot'`), joined by ` | ` (`several`), and `param` the
first problem's path, as vLLM's `param` names the first error's location.

Models raise `field_error` for what pydantic cannot state (a field that needs another, a grammar that does
not compile). Union members are tagged `<name>` (`Tag`); pydantic puts the tag in an error's location, and
paths leave it out.
"""
from typing import Any, Dict, List, Optional, Tuple, Type, get_args

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails, PydanticCustomError

from appliance.errors import PROBLEMS_JOIN, InputError

FIELD_ERROR = "request_field"
# Problems with a thing as a whole: the path names the item itself, not the list holding it.
WHOLE = {"missing", "extra_forbidden", "model_type", "union_tag_not_found", "union_tag_invalid", FIELD_ERROR}
TYPES = {"int_type": "an integer", "float_type": "a number", "finite_number": "a number",
         "bool_type": "true or false"}
BOUNDS = {"greater_than_equal": ("ge", ">="), "greater_than": ("gt", ">"), "less_than_equal": ("le", "<="),
          "less_than": ("lt", "<")}


def field_error(message: str, field: str = "") -> PydanticCustomError:
    """Raised by a model's validator: `message` about the `field` below the one validated (`a.b`), if any."""
    return PydanticCustomError(FIELD_ERROR, "{message}", {"message": message, "field": field})


def located(at: str, where: str, message: str) -> InputError:
    """`where: message`, under `at` (a batch file's `line 3: body`); `param` the field's path in the body."""
    full = f"{at}.{where}" if at and where else (at or where)
    return InputError(f"{full or 'body'}: {message}", param=full.split(": ")[-1] or None)


def several(errors: List[InputError]) -> InputError:
    """One error naming every field of `errors` (each message names its own), `param` the first's."""
    first = errors[0]
    if len(errors) == 1:
        return first
    return InputError(PROBLEMS_JOIN.join(str(e) for e in errors), param=first.param, status=first.status)


def input_error(error: ValidationError, model: Type[BaseModel], expected: Dict[str, str], at: str = "",
                unknown: str = "unknown field") -> InputError:
    """Every problem of `error`, once per field. `expected`: what a field should be, by path with list
    indexes as `[]` (`messages[].content`); a dict's keys as `field[key]`. `unknown`: how an unknown field
    is called."""
    problems: Dict[Optional[str], InputError] = {}
    for problem in error.errors():
        found = _problem(problem, model, expected, at, unknown)
        problems.setdefault(found.param, found)
    return several(list(problems.values()))


def _problem(problem: ErrorDetails, model: Type[BaseModel], expected: Dict[str, str], at: str,
             unknown: str) -> InputError:
    loc: Tuple = tuple(key for key in problem["loc"] if not _is_tag(key))
    kind, given, ctx = problem["type"], problem.get("input"), problem.get("ctx") or {}
    if kind == FIELD_ERROR:
        return located(at, _path(loc + tuple(k for k in ctx["field"].split(".") if k)), ctx["message"])
    if kind not in WHOLE:
        while len(loc) > 1 and isinstance(loc[-1], int):  # an item of a list: name the list
            loc = loc[:-1]
    shape = _shape(loc)
    if loc and loc[-1] == "[key]":  # a dict's key: the path names the key, `expected` the dict's keys
        loc, shape = loc[:-1], _shape(loc[:-2]) + "[key]"
    if kind == "missing":
        message = f"required, {expected[shape]}" if shape in expected else "required"
    elif kind == "extra_forbidden":
        message = f"{unknown}; allowed: {', '.join(sorted(_model_at(model, loc[:-1]).model_fields))}"
    elif kind == "literal_error":
        allowed = ctx["expected"].replace("'", "").replace(" or ", ", ")
        message = f"{given!r:.80}; allowed: {allowed}"
    elif shape in expected:
        message = f"expected {expected[shape]}, got {given!r:.80}"
    elif kind in TYPES:
        message = f"expected {TYPES[kind]}, got {given!r:.80}"
    elif kind in BOUNDS:
        name, sign = BOUNDS[kind]
        message = f"{given!r:.80}; allowed: {sign} {ctx[name]}"
    else:
        message = f"{problem['msg'][0].lower()}{problem['msg'][1:]}, got {given!r:.80}"
    return located(at, _path(loc), message)


def _is_tag(key: Any) -> bool:
    return isinstance(key, str) and key.startswith("<") and key.endswith(">")


def _path(loc: Tuple) -> str:
    text = ""
    for key in loc:
        text += f"[{key}]" if isinstance(key, int) else (f".{key}" if text else str(key))
    return text


def _shape(loc: Tuple) -> str:
    """The path with list indexes as `[]`: `messages[].content`."""
    return "".join("[]" if isinstance(key, int) else f".{key}" for key in loc).lstrip(".")


def _model_at(model: Type[BaseModel], loc: Tuple) -> Type[BaseModel]:
    """The (nested) model at `loc`."""
    for key in loc:
        if not isinstance(key, int):
            inner = _model_in(model.model_fields[key].annotation)
            if inner is None:
                raise RuntimeError(f"{model.__name__}.{key} holds no model")
            model = inner
    return model


def _model_in(annotation: Any) -> Optional[Type[BaseModel]]:
    """The model an annotation holds (`Optional[StreamOptions]` -> StreamOptions)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None

