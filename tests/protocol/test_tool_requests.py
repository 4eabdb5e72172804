"""`tools`, `tool_choice`, `parallel_tool_calls` and tool messages in a chat completion body: what each
asks of the answer (and of the sampler), and every refusal naming its field."""
import json

import pytest

from appliance.errors import InputError
from appliance.protocol.openai_requests import parse_chat

HI = [{"role": "user", "content": "Hi"}]
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time"}}]
STRICT_WEATHER = {**WEATHER, "additionalProperties": False}  # as the grammar reads it (strict_schema.py)
NAMED = {"type": "function", "function": {"name": "get_weather"}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}


def chat(**fields):
    return {"messages": HI, **fields}


def test_a_named_choice_constrains_the_answer_to_the_functions_parameters():
    request = parse_chat(chat(tools=TOOLS, tool_choice=NAMED))
    assert (request.tool_calling.mode, request.tool_calling.name) == ("named", "get_weather")
    assert json.loads(request.sampling["structured"].spec) == STRICT_WEATHER
    assert request.tools == TOOLS  # rendered into the prompt


@pytest.mark.parametrize("parallel, most", [(None, None), (True, None), (False, 1)])
def test_required_constrains_to_a_list_of_calls_of_the_tools(parallel, most):
    fields = {} if parallel is None else {"parallel_tool_calls": parallel}
    request = parse_chat(chat(tools=TOOLS, tool_choice="required", **fields))
    schema = json.loads(request.sampling["structured"].spec)
    assert schema["type"] == "array" and schema["minItems"] == 1 and schema.get("maxItems") == most
    calls = schema["items"]["anyOf"]
    assert [c["properties"]["name"]["enum"] for c in calls] == [["get_weather"], ["get_time"]]
    assert calls[0]["properties"]["parameters"] == STRICT_WEATHER
    assert calls[1]["properties"]["parameters"] == {"type": "object", "properties": {}, "additionalProperties": False}


@pytest.mark.parametrize("fields, mode", [
    ({"tools": TOOLS}, "auto"),  # OpenAI's and vLLM's default with tools
    ({"tools": TOOLS, "tool_choice": "auto"}, "auto"),
    ({"tools": TOOLS, "tool_choice": "none"}, None),
    ({"tools": TOOLS, "tool_choice": None}, "auto"),
    ({"tools": []}, None),
    ({"tool_choice": "none"}, None),
    ({}, None),
])
def test_what_the_answer_holds(fields, mode):
    request = parse_chat(chat(**fields))
    assert (request.tool_calling.mode if request.tool_calling else None) == mode
    assert "structured" not in request.sampling  # only named and required choices constrain


@pytest.mark.parametrize("fields, parallel", [({}, True), ({"parallel_tool_calls": True}, True),
                                              ({"parallel_tool_calls": False}, False)])
@pytest.mark.parametrize("choice", ["auto", "required", NAMED], ids=["auto", "required", "named"])
def test_every_mode_knows_the_tools_schemas_and_whether_calls_may_be_parallel(choice, fields, parallel):
    calling = parse_chat(chat(tools=TOOLS, tool_choice=choice, **fields)).tool_calling
    assert calling.parallel is parallel
    assert {name: json.loads(schema) for name, schema in calling.schemas} == {
        "get_weather": STRICT_WEATHER, "get_time": {"type": "object", "properties": {}, "additionalProperties": False}}


OBJECT = {"type": "object", "properties": {"shape": {"type": "string"}}}


@pytest.mark.parametrize("fields", [
    {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": OBJECT}}},
    {"structured_outputs": {"json": OBJECT}},
    {"structured_outputs": {"json": json.dumps(OBJECT)}},
], ids=["response_format", "structured_outputs", "structured_outputs as text"])
def test_a_json_schema_answer_is_strict_too(fields):
    assert json.loads(parse_chat(chat(**fields)).sampling["structured"].spec) == {**OBJECT,
                                                                                   "additionalProperties": False}


def test_json_object_stays_any_object():
    assert json.loads(parse_chat(chat(response_format={"type": "json_object"})).sampling["structured"].spec) == {
        "type": "object"}


def test_a_conversation_with_calls_and_their_results_is_taken_as_sent():
    messages = [*HI, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_1", "content": "12 C"},
                {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "sunny"}]}]
    assert parse_chat({"messages": messages, "tools": TOOLS}).messages == messages


BAD = [  # (body, param, fragment)
    (chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice.function.name",
     "'nope' is not among tools (get_weather, get_time)"),
    (chat(tool_choice="required"), "tool_choice", "needs tools"),
    (chat(tool_choice=NAMED), "tool_choice", "needs tools"),
    (chat(tools=[], tool_choice="required"), "tool_choice", "needs at least one tool"),
    (chat(tools=TOOLS, tool_choice="sometimes"), "tool_choice", "'sometimes'; allowed: none, auto, required"),
    (chat(tools=TOOLS, tool_choice=3), "tool_choice", 'expected "none", "auto", "required" or {"type": "function"'),
    (chat(tools=TOOLS, tool_choice={"type": "function"}), "tool_choice.function", "required, an object {name}"),
    (chat(tools=TOOLS, parallel_tool_calls="no"), "parallel_tool_calls", "expected true or false"),
    (chat(tools={"get_weather": {}}), "tools", "expected a list of {type"),
    (chat(tools=[{"type": "function"}]), "tools[0].function", "required"),
    (chat(tools=[{"type": "retrieval", "function": {"name": "x"}}]), "tools[0].type", "allowed: function"),
    (chat(tools=[{"type": "function", "function": {"name": ""}}]), "tools[0].function.name", "a non-empty string"),
    (chat(tools=[TOOLS[0], TOOLS[0]]), "tools[1].function.name", "'get_weather' repeats"),
    (chat(tools=[{"type": "function", "function": {"name": "f", "parameters": "object"}}]),
     "tools[0].function.parameters", "expected a JSON schema object"),
    (chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "thing"}}}],
          tool_choice="required"), "tools[0].function.parameters", "cannot compile"),
    (chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "thing"}}}],
          tool_choice="auto"), "tools[0].function.parameters", "not a valid JSON schema: 'thing' is not valid"),
    (chat(tools=TOOLS, tool_choice=NAMED, response_format={"type": "json_object"}), "tool_choice",
     "leave out response_format and structured_outputs"),
    (chat(messages=[{"role": "tool", "content": "12 C"}]), "messages[0].tool_call_id", "required in a tool message"),
    (chat(messages=[{"role": "tool", "tool_call_id": "c", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]), "messages[0].content", "text only"),
    (chat(messages=[{"role": "assistant"}]), "messages[0].content", "required, a string or a non-empty list"),
    (chat(messages=[{"role": "user", "content": "x", "tool_calls": [CALL]}]), "messages[0].tool_calls",
     "only an assistant message carries tool calls"),
    (chat(messages=[{"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": {}}}]}]),
     "messages[0].tool_calls[0].function.arguments", "the arguments as JSON text"),
    (chat(messages=[{"role": "assistant", "tool_calls": []}]), "messages[0].tool_calls", "non-empty list"),
]


@pytest.mark.parametrize("body, param, fragment", BAD, ids=[f"{b[1]} {i}" for i, b in enumerate(BAD)])
def test_a_bad_tool_field_is_named(body, param, fragment):
    with pytest.raises(InputError) as info:
        parse_chat(body)
    assert info.value.param == param
    assert str(info.value).startswith(f"{param}: ") and fragment in str(info.value), str(info.value)


def test_a_batch_line_with_tools_is_refused_naming_the_field():
    with pytest.raises(InputError) as info:
        parse_chat(chat(tools=TOOLS, tool_choice=NAMED), at="line 2: body", allow_stream=False)
    assert str(info.value).startswith("line 2: body.tools: batch requests cannot call tools")
