"""A setting's rule, declared once on its schema field and read by everything that checks it.

    stream_interval: int = field(default=1, metadata=rule(ge=1, why="tokens per streamed chunk"))

`check_fields` checks a config (a composed node or a dataclass) against its schema's rules, nested
dataclasses included, then calls the schema's `verify` (rules between fields), raising ConfigError
with one line: `server.stream_interval: 0; allowed: 1 or more (tokens per streamed chunk)`.
compose.validate runs it, so `check`, `run` and `serve` refuse a bad setting before any model loads;
scripts/helm_schema_defs.py turns the same rules into the chart's values schema. A numeric field with
no range says why with `unbounded(why)` (tests/frame/test_field_rules.py holds every field to one).
Imports neither Hydra nor OmegaConf: the engine's schema uses it too.
"""
import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Optional, Tuple, Union

from appliance.errors import ConfigError

RULE = "rule"
UNBOUNDED = "unbounded"


@dataclass(frozen=True)
class Rule:
    """What a value may be: bounds (ge, gt, le, lt), one of `choices`, or a full match of `pattern`. On a
    list field it applies to each item. `why` says what the value means (for a pattern: what it must be)."""

    ge: Optional[float] = None
    gt: Optional[float] = None
    le: Optional[float] = None
    lt: Optional[float] = None
    choices: Optional[Tuple[Union[str, int], ...]] = None
    pattern: Optional[str] = None
    why: str = ""

    def __post_init__(self):
        if self.pattern is not None and not self.why:
            raise TypeError("a pattern rule needs `why`: the error shows it instead of the expression")
        if (self.ge, self.gt, self.le, self.lt, self.choices, self.pattern) == (None,) * 6:
            raise TypeError("a rule declares a bound, choices or a pattern")

    def admits(self, value) -> bool:
        if self.pattern is not None:
            return isinstance(value, str) and re.fullmatch(self.pattern, value) is not None
        if self.choices is not None:
            return value in self.choices
        return ((self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt))

    def allowed(self) -> str:
        """What is allowed, as the error and the docs write it: `1 or more`, `1 to 65535`, `a, b`."""
        if self.pattern is not None:
            return self.why
        if self.choices is not None:
            return ", ".join(map(str, self.choices))
        low = _number(self.ge) if self.ge is not None else f"more than {_number(self.gt)}" if self.gt is not None \
            else ""
        high = _number(self.le) if self.le is not None else f"less than {_number(self.lt)}" if self.lt is not None \
            else ""
        if self.ge is not None and self.le is not None:
            return f"{low} to {high}"
        if low and high:
            return f"{low}, {high}"
        if self.ge is not None:
            return f"{low} or more"
        if self.le is not None:
            return f"{high} or less"
        return low or high

    def message(self, key: str, value) -> str:
        shown = repr(value) if isinstance(value, str) else _number(value)
        why = f" ({self.why})" if self.why and self.pattern is None else ""
        return f"{key}: {shown}; allowed: {self.allowed()}{why}"

    def json_schema(self) -> dict:
        """The rule in JSON Schema's words (the Helm chart's values schema)."""
        words = {"minimum": self.ge, "exclusiveMinimum": self.gt, "maximum": self.le, "exclusiveMaximum": self.lt,
                 "enum": list(self.choices) if self.choices is not None else None,
                 "pattern": f"^({self.pattern})$" if self.pattern is not None else None}
        return {name: whole_as_int(value) for name, value in words.items() if value is not None}


def rule(**kwargs) -> dict:
    """Field metadata declaring the field's Rule."""
    return {RULE: Rule(**kwargs)}


def unbounded(why: str) -> dict:
    """Field metadata of a numeric field that takes any value, and why."""
    return {UNBOUNDED: why}


def field_rule(schema: type, name: str) -> Optional[Rule]:
    """The Rule declared on `schema`'s field `name` (an Enum-typed field's members are its choices)."""
    f = {f.name: f for f in dataclasses.fields(schema)}[name]
    if isinstance(f.type, type) and issubclass(f.type, Enum):
        return Rule(choices=tuple(member.value for member in f.type))
    return f.metadata.get(RULE)


def check_fields(node, schema: type, prefix: str = "") -> None:
    """Every rule of `schema` (and its nested dataclasses) against `node`, which reads as the schema does
    (a composed DictConfig or an instance); then `schema.verify(node)` where the schema has one."""
    for f in dataclasses.fields(schema):
        key = f"{prefix}{f.name}"
        value = getattr(node, f.name)
        nested = nested_schema(f.type)
        if nested is not None:
            if value is not None:
                check_fields(value, nested, f"{key}.")
            continue
        found = f.metadata.get(RULE)
        if found is None or value is None:
            continue
        items = value if isinstance(value, Sequence) and not isinstance(value, str) else [value]
        for item in items:
            if not found.admits(item):
                raise ConfigError(found.message(key, item), param=key)
    verify = getattr(schema, "verify", None)
    if verify is not None:
        verify(node)


def nested_schema(annotation) -> Optional[type]:
    """The dataclass a field holds (`X` or `Optional[X]`), else None."""
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(candidate, type) and dataclasses.is_dataclass(candidate):
            return candidate
    return None


def _number(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def whole_as_int(value):
    """A float that is a whole number as an int (4.0 -> 4); any other value as it is."""
    return int(value) if isinstance(value, float) and value.is_integer() else value
