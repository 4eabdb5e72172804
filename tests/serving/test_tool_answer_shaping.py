"""The generate route's tool-calling answers, in process: `auto` takes the model's tool-call parser (or is
refused naming the setting), and a Hermes answer's events become a whole answer and stream chunks that
the answer models accept and that agree (the tiny LLaVA never writes `<tool_call>`, so the server
tests cannot reach this)."""
import pytest
from omegaconf import OmegaConf

from appliance.config.schema import ToolCallParser
from appliance.protocol.openai_answers import ChatCompletion, ChatCompletionChunk
from appliance.protocol.openai_requests import parse_chat
from appliance.protocol.openai_responses import TokenLogprob
from appliance.serving.http.errors import APIError
from appliance.serving.http.routes_generate import AnswerShaper, GenerateRoutes
from appliance.serving.messages import Tokens

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
PIECES = ["Checking.", " <tool_", 'call>{"name": "get_weather", ', '"arguments": {"city": "Oslo"}}</tool_call>']


def routes(parser):
    cfg = OmegaConf.create({"server": {"allowed_local_media_dir": None}, "model": {"tool_call_parser": parser}})
    return GenerateRoutes(None, cfg, {})


def auto_request(stream, **fields):
    request = parse_chat({"messages": [{"role": "user", "content": "Weather?"}], "tools": TOOLS, "stream": stream,
                          **fields})
    request.tool_calling = routes(ToolCallParser.hermes)._with_parser(request.tool_calling)
    return request


def test_auto_takes_the_models_parser():
    assert auto_request(False).tool_calling.parser == "hermes"


def test_auto_without_a_parser_is_refused_naming_the_setting():
    request = parse_chat({"messages": [{"role": "user", "content": "Hi"}], "tools": TOOLS})
    with pytest.raises(APIError) as info:
        routes(None)._with_parser(request.tool_calling)
    assert info.value.status == 400 and info.value.param == "tool_choice"
    assert "model.tool_call_parser=hermes" in info.value.message


def test_a_hermes_answer_whole_and_streamed():
    text = "".join(PIECES)
    shaper = AnswerShaper("chatcmpl-1", "chat", auto_request(False), "m")
    whole = shaper.whole([Tokens(text, 5, 20, None, "stop", 0, True)])
    message = ChatCompletion.model_validate(whole).choices[0].message
    assert message.content == "Checking." and whole["choices"][0]["finish_reason"] == "tool_calls"
    (call,) = message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_weather", '{"city": "Oslo"}')

    answer = AnswerShaper("chatcmpl-2", "chat", auto_request(True, logprobs=True), "m")
    events = [Tokens(piece, 5, i + 1, [TokenLogprob(piece, -0.5, ())], "stop" if i == len(PIECES) - 1 else None,
                     0, i == len(PIECES) - 1) for i, piece in enumerate(PIECES)]
    chunks = [ChatCompletionChunk.model_validate(c) for e in events for c in answer.chunks(e)]
    deltas = [c.choices[0].delta for c in chunks]
    assert "".join(d.content or "" for d in deltas) == "Checking."
    calls = [call for d in deltas for call in d.tool_calls or ()]
    assert calls[0].id.startswith("call_") and calls[0].function.name == "get_weather"
    assert "".join(c.function.arguments for c in calls) == '{"city": "Oslo"}'
    assert [c.choices[0].finish_reason for c in chunks][-1] == "tool_calls"
    # every event's logprobs go out once, on a chunk of their own answer, even when its text was held back
    sent = [entry.token for c in chunks if c.choices[0].logprobs for entry in c.choices[0].logprobs.content]
    assert sent == PIECES


@pytest.mark.parametrize("text, parallel, content, calls", [
    ('<tool_call>{"name": "fly", "arguments": {}}</tool_call>', True,
     '<tool_call>{"name": "fly", "arguments": {}}</tool_call>', []),  # no such tool
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}}</tool_call>', True,
     '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}}</tool_call>', []),  # unlisted key
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
     '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>', False,
     '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>', ['{"city": "Oslo"}']),
], ids=["undeclared", "invalid", "one-call"])
def test_an_auto_answer_holds_only_calls_the_request_accepts(text, parallel, content, calls):
    """The request's tools and parallel_tool_calls reach the parser through the route: what they refuse is
    content, and an answer without a call finishes as text."""
    whole = AnswerShaper("chatcmpl-3", "chat", auto_request(False, parallel_tool_calls=parallel), "m").whole(
        [Tokens(text, 5, 20, None, "stop", 0, True)])
    choice = ChatCompletion.model_validate(whole).choices[0]
    assert choice.message.content == content
    assert [call.function.arguments for call in choice.message.tool_calls or ()] == calls
    assert choice.finish_reason == ("tool_calls" if calls else "stop")
