"""Tool calling through `appliance serve` with the official `openai` client and LangChain's defaults:
named and required choices (arguments valid for the function's schema, also when the schema leaves
`additionalProperties` unsaid or the function has no parameters), streamed calls that reassemble to the
whole answer's, a two-turn round trip with the tool's result, a call cut by max_tokens, and `auto`
refused on a model without a tool-call parser. The tiny LLaVA knows shapes and colours only: its
arguments are checked for validity, not for sense."""
import json
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from appliance.protocol.openai_answers import ChatCompletion, ChatCompletionChunk
from tests.servers import data_url, image_question

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
           "properties": {"city": {"type": "string", "maxLength": 12},
                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}
SHAPE = {"type": "object", "additionalProperties": False, "required": ["shape"],
         "properties": {"shape": {"type": "string", "enum": ["square", "circle", "star"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "draw", "description": "Draw a shape", "parameters": SHAPE}}]
PAINT = {"type": "object", "required": ["shape", "color"],  # as LangChain and most hand-written schemas: no
          "properties": {"shape": {"type": "string", "enum": ["square", "circle", "star"]},  # additionalProperties
                         "color": {"type": "string", "enum": ["red", "orange", "blue"]}}}
PAINT_TOOL = {"type": "function", "function": {"name": "paint", "description": "Paint a shape", "parameters": PAINT}}
NO_PARAMETERS_TOOL = {"type": "function", "function": {"name": "get_time", "description": "The time now"}}
SCHEMAS = {"get_weather": WEATHER, "draw": SHAPE, "paint": {**PAINT, "additionalProperties": False},
           "get_time": {"type": "object", "properties": {}, "additionalProperties": False}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def client(llava_server):
    return openai.OpenAI(base_url=f"{llava_server.base}/v1", api_key="unused", max_retries=0, timeout=120)


QUESTION = [{"role": "user", "content": "What is the weather in Oslo?"}]


def ask(client, stream=False, messages=QUESTION, max_tokens=160, **fields):
    return client.chat.completions.create(model="llava-tiny", messages=messages, temperature=0,
                                          max_tokens=max_tokens, tools=TOOLS, stream=stream, **fields)


def calls_of(message):
    return [(call.function.name, call.function.arguments) for call in message.tool_calls]


def check_calls(calls):
    for name, arguments in calls:
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def reassembled(chunks):
    """(content, [(name, arguments)], finish_reason, ids) of a streamed answer, as a client joins it."""
    content, calls, reason = "", {}, None
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or ():
                if call.id is not None:
                    assert call.function.arguments == "" and call.type == "function"
                    calls[call.index] = [call.function.name, "", call.id]
                calls[call.index][1] += call.function.arguments
            reason = choice.finish_reason or reason
    return content, [(n, a) for n, a, _ in calls.values()], reason, [i for _, _, i in calls.values()]


def test_a_named_choice_answers_one_call_of_that_function(client):
    answer = ask(client, messages=image_question(data_url()), max_tokens=64, tool_choice=NAMED)
    message = answer.choices[0].message
    assert message.content is None and answer.choices[0].finish_reason == "tool_calls"
    (call,) = message.tool_calls
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    check_calls(calls_of(message))


def test_required_answers_calls_of_the_tools(client):
    """The tiny model keeps adding calls until max_tokens: the item it cut is no call, every call is valid."""
    answer = ask(client, tool_choice="required")
    calls, reason = calls_of(answer.choices[0].message), answer.choices[0].finish_reason
    assert calls and all(name in SCHEMAS for name, _ in calls) and reason in ("tool_calls", "length")
    check_calls(calls)
    assert len({call.id for call in answer.choices[0].message.tool_calls}) == len(calls)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("parallel", [None, False], ids=["parallel", "one"])
def test_required_with_a_schema_that_leaves_additional_properties_unsaid(client, stream, parallel):
    """The schema is read strictly: the model cannot add keys of its own, so the arguments parse."""
    fields = {} if parallel is None else {"parallel_tool_calls": parallel}
    answer = client.chat.completions.create(model="llava-tiny", messages=[{"role": "user", "content": "Paint it."}],
                                            temperature=0, max_tokens=96, tools=[PAINT_TOOL, TOOLS[1]],
                                            tool_choice="required", stream=stream, **fields)
    if stream:
        _, calls, reason, _ = reassembled(answer)
    else:
        calls, reason = calls_of(answer.choices[0].message), answer.choices[0].finish_reason
    assert calls and {name for name, _ in calls} <= {"paint", "draw"} and reason in ("tool_calls", "length")
    assert len(calls) == 1 or parallel is None
    check_calls(calls)


def test_a_function_without_parameters_is_called_with_an_empty_object(client):
    answer = client.chat.completions.create(model="llava-tiny", messages=QUESTION, temperature=0, max_tokens=32,
                                            tools=[NO_PARAMETERS_TOOL],
                                            tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert calls_of(answer.choices[0].message) == [("get_time", "{}")]
    assert answer.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_call_max_tokens_cuts_finishes_with_length(client, stream):
    """A free string is where the grammar lets the tiny model write on; max_tokens ends it, and says so."""
    note = {"type": "function", "function": {"name": "note", "parameters": {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}
    answer = client.chat.completions.create(model="llava-tiny", messages=QUESTION, temperature=0, max_tokens=12,
                                            tools=[note],
                                            tool_choice={"type": "function", "function": {"name": "note"}},
                                            stream=stream)
    if stream:
        _, calls, reason, _ = reassembled(answer)
    else:
        calls, reason = calls_of(answer.choices[0].message), answer.choices[0].finish_reason
    assert reason == "length"
    assert calls[0][0] == "note" and calls[0][1].startswith('{"text": "')


def test_required_without_parallel_calls_answers_one(client):
    answer = ask(client, tool_choice="required", parallel_tool_calls=False)
    assert len(answer.choices[0].message.tool_calls) == 1 and answer.choices[0].finish_reason == "tool_calls"
    check_calls(calls_of(answer.choices[0].message))


@pytest.mark.parametrize("fields", [{"tool_choice": NAMED}, {"tool_choice": "required"},
                                    {"tool_choice": "required", "parallel_tool_calls": False}],
                         ids=["named", "required", "required-one"])
def test_a_streamed_call_reassembles_to_the_whole_answers(client, fields):
    whole = ask(client, **fields).choices[0]
    content, calls, reason, ids = reassembled(ask(client, stream=True, **fields))
    assert (content, calls, reason) == ("", calls_of(whole.message), whole.finish_reason)
    assert all(i.startswith("call_") for i in ids) and len(set(ids)) == len(ids)


def test_answers_and_chunks_are_what_the_answer_models_describe(llava_server):
    body = {"messages": QUESTION, "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False,
            "max_tokens": 160, "temperature": 0}
    ChatCompletion.model_validate(httpx.post(f"{llava_server.base}/v1/chat/completions", json=body,
                                             timeout=120).json())
    with httpx.stream("POST", f"{llava_server.base}/v1/chat/completions", json={**body, "stream": True},
                      timeout=120) as response:
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [ChatCompletionChunk.model_validate_json(event) for event in events[:-1]]
    assert chunks[-1].choices[0].finish_reason == "tool_calls" and chunks[-1].choices[0].delta.tool_calls is None


def test_a_tool_result_goes_back_and_the_answer_is_text(client):
    first = ask(client, tool_choice=NAMED)
    call = first.choices[0].message.tool_calls[0]
    messages = [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                {"role": "tool", "tool_call_id": call.id, "content": "12 degrees and sunny"}]
    second = client.chat.completions.create(model="llava-tiny", messages=messages, tools=TOOLS, tool_choice="none",
                                            temperature=0, max_tokens=8)
    assert isinstance(second.choices[0].message.content, str) and second.choices[0].message.tool_calls is None
    assert second.choices[0].finish_reason in ("stop", "length")
    # the call and its result are in the prompt
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + 10


@pytest.mark.parametrize("fields", [{"tool_choice": "auto"}, {}], ids=["auto", "default"])
def test_auto_needs_a_tool_call_parser_and_says_which_setting(client, fields):
    with pytest.raises(openai.BadRequestError) as info:
        ask(client, **fields)
    error = info.value.body
    assert error["param"] == "tool_choice" and "model.tool_call_parser=hermes" in error["message"]


def test_a_choice_naming_no_tool_is_refused(client):
    with pytest.raises(openai.BadRequestError) as info:
        ask(client, tool_choice={"type": "function", "function": {"name": "fly"}})
    assert info.value.body["param"] == "tool_choice.function.name" and "'fly' is not among tools" in \
        info.value.body["message"]


# ---- LangChain ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def chat_model(llava_server):
    langchain_openai = pytest.importorskip("langchain_openai")
    return langchain_openai.ChatOpenAI(base_url=f"{llava_server.base}/v1", api_key="x", model="llava-tiny",
                                       temperature=0, max_tokens=96, max_retries=0, timeout=120)


class Paint(BaseModel):
    """Paint a shape in a colour."""
    shape: Literal["square", "circle", "star"]
    color: Literal["red", "orange", "blue"]


@pytest.mark.parametrize("choice", ["Paint", "required", "any"])
def test_langchain_bind_tools_defaults_get_tool_calls(chat_model, choice):
    """No `strict`, no `parallel_tool_calls`: LangChain's schema says nothing of additionalProperties."""
    function_calling = pytest.importorskip("langchain_core.utils.function_calling")
    assert "additionalProperties" not in function_calling.convert_to_openai_tool(Paint)["function"]["parameters"]
    answer = chat_model.bind_tools([Paint], tool_choice=choice).invoke("Paint a red square.")
    assert answer.tool_calls and not answer.invalid_tool_calls
    for call in answer.tool_calls:
        assert call["name"] == "Paint"
        Paint(**call["args"])
    assert answer.response_metadata["finish_reason"] in (("tool_calls",) if choice == "Paint" else
                                                         ("tool_calls", "length"))


def test_langchain_structured_output_by_function_calling(chat_model):
    result = chat_model.with_structured_output(Paint, method="function_calling").invoke("Which shape is it?")
    assert isinstance(result, Paint)


def test_langchain_agent_loop_of_two_turns(chat_model):
    """The model calls the tool, the tool's result goes back as a ToolMessage, the model answers in text."""
    tools = pytest.importorskip("langchain_core.tools")
    messages_module = pytest.importorskip("langchain_core.messages")

    @tools.tool
    def paint(shape: Literal["square", "circle", "star"], color: Literal["red", "orange", "blue"]) -> str:
        """Paint a shape in a colour."""
        return f"painted a {color} {shape}"

    conversation = [messages_module.HumanMessage("Paint a red square.")]
    first = chat_model.bind_tools([paint], tool_choice="paint").invoke(conversation)
    assert len(first.tool_calls) == 1 and not first.invalid_tool_calls
    conversation += [first, paint.invoke(first.tool_calls[0])]  # a ToolMessage answering the call's id
    assert isinstance(conversation[-1], messages_module.ToolMessage)
    second = chat_model.bind_tools([paint], tool_choice="none").bind(max_tokens=8).invoke(conversation)
    assert isinstance(second.content, str) and not second.tool_calls and not second.invalid_tool_calls
    assert second.response_metadata["finish_reason"] in ("stop", "length")
