"""A pydantic `ValidationError` as our `InputError`: the first problem, its message starting with the
field's path (`data.data_format: 's3'; allowed: b64_json, url, path`) and `param` the path."""
from typing import Dict, List, Tuple, Type

from pydantic import BaseModel, ValidationError

from appliance.errors import InputError


def input_error(error: ValidationError, model: Type[BaseModel], expected: Dict[str, str]) -> InputError:
    """`expected`: what a field should be, by path, for type errors and missing fields."""
    problem = error.errors()[0]
    loc: Tuple = _fields_only(model, problem["loc"])
    while len(loc) > 1 and isinstance(loc[-1], int):  # a list's item: name the list
        loc = loc[:-1]
    where = _path(loc)
    kind, given = problem["type"], problem.get("input")
    if kind == "missing":
        message = f"required, {expected[where]}" if where in expected else "required"
    elif kind == "extra_forbidden":
        message = f"unknown field; allowed: {', '.join(_fields(model, loc[:-1]))}"
    elif kind == "literal_error":
        allowed = problem["ctx"]["expected"].replace("'", "").replace(" or ", ", ")
        message = f"{given!r:.80}; allowed: {allowed}"
    elif where in expected or _path(loc[:-1]) in expected:
        message = f"expected {expected.get(where) or expected[_path(loc[:-1])]}, got {given!r:.80}"
    else:
        message = f"{problem['msg'][0].lower()}{problem['msg'][1:]}, got {given!r:.80}"
    return InputError(f"{where}: {message}", param=where)


def _fields_only(model: Type[BaseModel], loc: Tuple) -> Tuple:
    """`loc` without the tags pydantic adds for a union's members (`data.data.list[constrained-str].0`)."""
    kept, current = [], model
    for key in loc:
        if isinstance(key, int):
            kept.append(key)
        elif isinstance(current, type) and issubclass(current, BaseModel):  # a field, or an unknown one
            kept.append(key)
            current = current.model_fields[key].annotation if key in current.model_fields else None
    return tuple(kept)


def _path(loc: Tuple) -> str:
    text = ""
    for key in loc:
        text += f"[{key}]" if isinstance(key, int) else (f".{key}" if text else str(key))
    return text


def _fields(model: Type[BaseModel], loc: Tuple) -> List[str]:
    """The fields of the (nested) model at `loc`."""
    for key in loc:
        if isinstance(key, int):
            continue
        model = model.model_fields[key].annotation
    return list(model.model_fields)
