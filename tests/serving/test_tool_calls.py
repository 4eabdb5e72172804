"""Tool calling through `appliance serve` with the official `openai` client and LangChain: named and
required choices (arguments valid for the function's schema), streamed calls that reassemble to the
whole answer's, a two-turn round trip with the tool's result, and `auto` refused on a model without a
tool-call parser. The tiny LLaVA knows shapes and colours only: its arguments are checked for validity,
not for sense."""
import json
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

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
SCHEMAS = {"get_weather": WEATHER, "draw": SHAPE}
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
    """The tiny model keeps adding calls until max_tokens: each finished call is valid, the cut one is
    the last (its arguments as far as they came)."""
    answer = ask(client, tool_choice="required")
    calls, reason = calls_of(answer.choices[0].message), answer.choices[0].finish_reason
    assert calls and all(name in SCHEMAS for name, _ in calls) and reason in ("tool_calls", "length")
    check_calls(calls if reason == "tool_calls" else calls[:-1])
    assert len({call.id for call in answer.choices[0].message.tool_calls}) == len(calls)


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


class GetWeather(BaseModel):
    """The weather in a city."""
    city: str = Field(max_length=12)  # bounded: the tiny model would fill a free string to max_tokens
    unit: Literal["celsius", "fahrenheit"]


@pytest.mark.parametrize("choice", ["GetWeather", "required"])
def test_langchain_bind_tools_gets_tool_calls(chat_model, choice):
    # strict: additionalProperties false, else the schema lets the tiny model add keys until max_tokens
    answer = chat_model.bind_tools([GetWeather], tool_choice=choice, parallel_tool_calls=False, strict=True).invoke(
        "What is the weather in Oslo?")
    assert [call["name"] for call in answer.tool_calls] == ["GetWeather"] and not answer.invalid_tool_calls
    GetWeather(**answer.tool_calls[0]["args"])
    assert answer.response_metadata["finish_reason"] == "tool_calls"


def test_langchain_structured_output_by_function_calling(chat_model):
    class Shape(BaseModel):
        """A shape and its colour."""
        shape: Literal["square", "circle", "star"]
        color: Literal["red", "orange", "blue"]

    result = chat_model.with_structured_output(Shape, method="function_calling", strict=True).invoke(
        "Which shape is it?")
    assert isinstance(result, Shape)
