"""JSON schemas read in xgrammar's strict mode (strict_schema.py): a table of schemas and what the
grammar is given, then what the compiled grammar lets through, fed token by token to llguidance with
the tiny LLaVA's tokenizer."""
import json

import pytest

from appliance.engine.structured_output import StructuredOutput
from appliance.protocol.strict_schema import strict_schema
from tests.servers import LLAVA_TINY

STRING = {"type": "string"}
CLOSED = {"additionalProperties": False}

CASES = [  # (label, schema, what the grammar is given)
    ("an object without properties", {"type": "object"}, {"type": "object", **CLOSED}),
    ("listed properties", {"type": "object", "properties": {"a": STRING}},
     {"type": "object", "properties": {"a": STRING}, **CLOSED}),
    ("properties without a type", {"properties": {"a": STRING}}, {"properties": {"a": STRING}, **CLOSED}),
    ("a type list with object", {"type": ["object", "null"]}, {"type": ["object", "null"], **CLOSED}),
    ("additionalProperties true is the schema's own choice", {"type": "object", "additionalProperties": True},
     {"type": "object", "additionalProperties": True}),
    ("additionalProperties a schema: its objects closed",
     {"type": "object", "additionalProperties": {"type": "object"}},
     {"type": "object", "additionalProperties": {"type": "object", **CLOSED}}),
    ("additionalProperties false stays", {"type": "object", "additionalProperties": False},
     {"type": "object", "additionalProperties": False}),
    ("unevaluatedProperties left as written", {"type": "object", "unevaluatedProperties": True},
     {"type": "object", "unevaluatedProperties": True}),
    ("nested objects", {"type": "object", "properties": {"o": {"type": "object", "properties": {"b": STRING}}}},
     {"type": "object", "properties": {"o": {"type": "object", "properties": {"b": STRING}, **CLOSED}}, **CLOSED}),
    ("array items", {"type": "array", "items": {"type": "object"}},
     {"type": "array", "items": {"type": "object", **CLOSED}}),
    ("prefixItems without items", {"type": "array", "prefixItems": [STRING]},
     {"type": "array", "prefixItems": [STRING], "items": False}),
    ("prefixItems with items", {"type": "array", "prefixItems": [STRING], "items": STRING},
     {"type": "array", "prefixItems": [STRING], "items": STRING}),
    ("anyOf: the members closed, not the union", {"type": "object", "anyOf": [{"properties": {"a": STRING}}]},
     {"type": "object", "anyOf": [{"properties": {"a": STRING}, **CLOSED}]}),
    ("oneOf members", {"oneOf": [{"type": "object"}, STRING]}, {"oneOf": [{"type": "object", **CLOSED}, STRING]}),
    ("allOf of several: members open at their top, closed inside",
     {"allOf": [{"properties": {"a": {"type": "object"}}}, {"properties": {"b": STRING}}]},
     {"allOf": [{"properties": {"a": {"type": "object", **CLOSED}}}, {"properties": {"b": STRING}}]}),
    ("allOf of one", {"allOf": [{"properties": {"a": STRING}}]}, {"allOf": [{"properties": {"a": STRING}, **CLOSED}]}),
    ("$defs and definitions", {"$defs": {"A": {"type": "object"}}, "definitions": {"B": {"properties": {}}},
                               "$ref": "#/$defs/A"},
     {"$defs": {"A": {"type": "object", **CLOSED}}, "definitions": {"B": {"properties": {}, **CLOSED}},
      "$ref": "#/$defs/A"}),
    ("patternProperties: the patterns still apply", {"type": "object", "patternProperties": {"^x": STRING}},
     {"type": "object", "patternProperties": {"^x": STRING}, **CLOSED}),
    ("not left as written", {"not": {"type": "object"}}, {"not": {"type": "object"}}),
    ("any value", {}, {}),
    ("a boolean schema", True, True),
]


@pytest.mark.parametrize("schema, strict", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_strict_mode_closes_what_the_schema_leaves_open(schema, strict):
    before = json.dumps(schema)
    assert strict_schema(schema) == strict
    assert json.dumps(schema) == before  # the request's own schema is left alone


@pytest.fixture(scope="module")
def accepts():
    """accepts(schema, text): whether the grammar of `schema`, as a request's JSON schema is compiled,
    takes `text` whole."""
    if not (LLAVA_TINY / "tokenizer.json").is_file():
        pytest.skip("appliance/assets/models/llava_tiny is missing")
    import llguidance
    import llguidance.hf
    from transformers import AutoTokenizer

    tokenizer = llguidance.hf.from_tokenizer(AutoTokenizer.from_pretrained(LLAVA_TINY))

    def check(schema, text):
        grammar = StructuredOutput("json", json.dumps(strict_schema(schema))).grammar()
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        tokens = tokenizer.tokenize_str(text)
        if matcher.validate_tokens(tokens) < len(tokens):
            return False
        matcher.consume_tokens(tokens)
        return matcher.is_accepting()
    return check


SHAPE = {"type": "object", "properties": {"shape": {"type": "string", "enum": ["square", "circle"]}}}
GRAMMAR_CASES = [  # (schema, text, taken)
    (SHAPE, '{"shape": "square"}', True),
    (SHAPE, '{"shape": "square", "color": "red"}', False),  # LangChain's schemas: no unlisted keys
    (SHAPE, "{}", True),
    ({"type": "object", "properties": {}}, "{}", True),  # a function without parameters
    ({"type": "object", "properties": {}}, '{"a": 1}', False),
    ({"type": "object", "properties": {"o": SHAPE}}, '{"o": {"shape": "circle", "x": 1}}', False),
    ({"type": "object", "additionalProperties": True}, '{"a": 1}', True),  # the schema's own opt-out
    ({"type": "object", "additionalProperties": {"type": "integer"}}, '{"a": 1}', True),
    ({"type": "object", "additionalProperties": {"type": "integer"}}, '{"a": "x"}', False),
    ({"type": "array", "prefixItems": [{"type": "integer"}]}, "[1, 2]", False),
    ({"anyOf": [SHAPE, {"type": "object", "properties": {"n": {"type": "integer"}}}]}, '{"n": 2}', True),
    ({"anyOf": [SHAPE, {"type": "object", "properties": {"n": {"type": "integer"}}}]}, '{"n": 2, "z": 1}', False),
]


@pytest.mark.parametrize("schema, text, taken", GRAMMAR_CASES, ids=[c[1] for c in GRAMMAR_CASES])
def test_the_grammar_takes_only_what_the_schema_lists(accepts, schema, text, taken):
    assert accepts(schema, text) is taken
