"""A request's JSON schema as the grammar reads it: xgrammar's strict mode, vLLM's default.

JSON Schema lets an object hold keys its schema does not list, and a grammar that allows them lets a
model write keys of its own until max_tokens (a schema without `additionalProperties`, as LangChain's
`bind_tools` and most hand-written tool schemas are). Strict mode generates only what the schema lists:
- an object schema (`type` names "object", or `properties` without a `type`) that says nothing of
  `additionalProperties` gets `"additionalProperties": false`; one that sets it (`true`, or a schema) is
  the schema's own opt-out and stays as written;
- `prefixItems` without `items` gets `"items": false` (no items past the listed ones);
- so, recursively, in every subschema: `properties`, `patternProperties`, `additionalProperties`,
  `items`, `prefixItems`, `anyOf`, `oneOf`, `allOf`, `$defs` and `definitions`.
A schema that combines others (`anyOf`, `oneOf`, `allOf`) is closed in its members only: closing it too
would, as JSON Schema intersects them, forbid the members' own properties. The members of an `allOf`
with several entries stay open at their top level, for the same reason. `not`, `if`/`then`/`else` and
`unevaluatedProperties` are left as written.
"""
from typing import Any, Dict

SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")  # name -> subschema
SCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")                  # [subschema]
SCHEMA_VALUES = ("additionalProperties", "items")                          # subschema (or a boolean)
COMBINATIONS = ("anyOf", "oneOf", "allOf")


def strict_schema(schema: Any, closed: bool = True) -> Any:
    """`schema` with strict mode's defaults written out (a new object; the argument is left alone);
    `closed`: False for an object that an `allOf` combines with others (its own keys stay as written)."""
    if not isinstance(schema, dict):
        return schema  # true / false, or a value that is not a schema (the grammar compiler judges it)
    out: Dict[str, Any] = dict(schema)
    for key in SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: strict_schema(sub) for name, sub in out[key].items()}
    for key in SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            open_members = key == "allOf" and len(out[key]) > 1
            out[key] = [strict_schema(sub, closed=not open_members) for sub in out[key]]
    for key in SCHEMA_VALUES:
        if key in out:
            out[key] = strict_schema(out[key])
    if closed and not any(key in out for key in COMBINATIONS):
        if is_object(out) and "additionalProperties" not in out and "unevaluatedProperties" not in out:
            out["additionalProperties"] = False
        if "prefixItems" in out and "items" not in out:
            out["items"] = False
    return out


def is_object(schema: Dict[str, Any]) -> bool:
    kind = schema.get("type")
    if kind is None:
        return "properties" in schema
    return kind == "object" or isinstance(kind, list) and "object" in kind
