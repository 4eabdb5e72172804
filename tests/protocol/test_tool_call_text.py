"""Tool calls read out of an answer's text, whole and in stream pieces (tool_call_text.py, tool_answers.py):
the pieces of every split reassemble into the whole answer, and an `auto` block that is not a valid call
of a declared tool stays content."""
import json

import pytest

from appliance.config.schema import ToolCallParser
from appliance.protocol.openai_requests import parse_chat
from appliance.protocol.openai_tools import ToolCalling
from appliance.protocol.tool_answers import ToolCallAnswer
from appliance.protocol.tool_call_text import PARSERS

WEATHER = {"type": "object", "required": ["city"],
           "properties": {"city": {"type": "string"}, "days": {"type": "array"}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time"}}]


def hermes(parallel=True, tools=TOOLS):
    """The ToolCalling of an `auto` request with `tools`, read by the hermes parser."""
    request = parse_chat({"messages": [{"role": "user", "content": "Hi"}], "tools": tools,
                          "parallel_tool_calls": parallel})
    return ToolCalling("auto", parser="hermes", schemas=request.tool_calling.schemas,
                       parallel=request.tool_calling.parallel)


HERMES = hermes()
TWO_CALLS = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris \\"<x>\\"", '
             '"days": [1, {"n": 2}]}}\n</tool_call>\n<tool_call>\n{"arguments": {}, "name": "get_time"}\n'
             '</tool_call>\n')


def streamed(calling, text, size):
    """The deltas of `text` fed `size` characters at a time, then the end."""
    answer = ToolCallAnswer(calling)
    deltas = [d for i in range(0, len(text), size) for d in answer.deltas(text[i:i + size])]
    return deltas + answer.deltas("", last=True), answer


def reassembled(deltas):
    """(content, [(id, name, arguments)]) as a client puts a stream back together."""
    content, calls = "", {}
    for delta in deltas:
        content += delta.get("content", "")
        for call in delta.get("tool_calls", ()):
            if "id" in call:
                assert call["function"]["arguments"] == "" and call["type"] == "function"
                assert call["index"] == len(calls)  # calls start in order
                calls[call["index"]] = [call["id"], call["function"]["name"], ""]
            calls[call["index"]][2] += call["function"]["arguments"]
    return content or None, [tuple(c) for c in calls.values()]


def block(call):
    return f"<tool_call>{call}</tool_call>"


CASES = [  # (calling, text, content, [(name, arguments)])
    (ToolCalling("named", "get_weather"), '{"city": "Oslo"}', None, [("get_weather", '{"city": "Oslo"}')]),
    (ToolCalling("required"), '[{"name": "a", "parameters": {"x": [1, "]}"]}}, {"name": "b", "parameters": {}}]',
     None, [("a", '{"x": [1, "]}"]}'), ("b", "{}")]),
    (ToolCalling("required"), '[{"name": "a", "parameters": {}}, {"name": "b", "parameters": {"x": "ab',
     None, [("a", "{}")]),  # a required item cut by max_tokens is no call
    (HERMES, TWO_CALLS, "Let me look.", [("get_weather", '{"city": "Paris \\"<x>\\"", "days": [1, {"n": 2}]}'),
                                          ("get_time", "{}")]),
    (HERMES, "No call here, 1 < 2 and <tool", "No call here, 1 < 2 and <tool", []),
    (HERMES, 'a <tool_call>{"no_name": 1}</tool_call> b', 'a <tool_call>{"no_name": 1}</tool_call> b', []),
    # refused, each stays content as written:
    (HERMES, block('{"name": "fly", "arguments": {}}'), block('{"name": "fly", "arguments": {}}'), []),  # no such tool
    (HERMES, block('{"name": "get_weather", "arguments": {"city": "Oslo"'),  # arguments not JSON
     block('{"name": "get_weather", "arguments": {"city": "Oslo"'), []),
    (HERMES, block('{"name": "get_weather", "arguments": {"town": "Oslo"}}'),  # invalid for the schema (strict)
     block('{"name": "get_weather", "arguments": {"town": "Oslo"}}'), []),
    (HERMES, block('{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}'),  # arguments a string
     block('{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}'), []),
    (HERMES, block('{"name": "get_time", "arguments": {"zone": "UTC"}}'),  # no parameters means {}
     block('{"name": "get_time", "arguments": {"zone": "UTC"}}'), []),
    (HERMES, block('{"name": "get_time"}'), block('{"name": "get_time"}'), []),  # no arguments
    (HERMES, '<tool_call>{"name": "get_time", "arguments": {', '<tool_call>{"name": "get_time", "arguments": {',
     []),  # cut by max_tokens
    (HERMES, block('{"name": "get_time", "arguments": {} }'), None, [("get_time", "{}")]),
    (hermes(parallel=False), TWO_CALLS, 'Let me look.\n\n<tool_call>\n{"arguments": {}, "name": "get_time"}\n'
     '</tool_call>', [("get_weather", '{"city": "Paris \\"<x>\\"", "days": [1, {"n": 2}]}')]),  # one call at most
]


@pytest.mark.parametrize("calling, text, content, calls", CASES, ids=range(len(CASES)))
def test_a_whole_answer_and_every_split_of_its_stream_agree(calling, text, content, calls):
    whole_content, whole_calls, reason = ToolCallAnswer(calling).whole(text, "stop")
    assert whole_content == content
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in whole_calls or ()] == calls
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in whole_calls or ())
    assert reason == ("tool_calls" if calls else "stop")
    for size in (1, 2, 3, 7, len(text)):
        deltas, _ = streamed(calling, text, size)
        got_content, got_calls = reassembled(deltas)
        assert got_content == content, size
        assert [(name, arguments) for _, name, arguments in got_calls] == calls, size
        assert len({call_id for call_id, _, _ in got_calls}) == len(calls)


def test_a_call_cut_by_max_tokens_keeps_length():
    assert ToolCallAnswer(ToolCalling("named", "f")).whole('{"a": ', "length")[2] == "length"
    _, calls, reason = ToolCallAnswer(ToolCalling("required")).whole(
        '[{"name": "a", "parameters": {}}, {"name": "b", "parameters": {"x', "length")
    assert [c["function"]["name"] for c in calls] == ["a"] and reason == "length"


def test_hermes_text_before_a_call_streams_and_the_call_goes_out_once_checked():
    answer = ToolCallAnswer(HERMES)
    assert answer.deltas("Checking") == [{"content": "Checking"}]
    assert answer.deltas(" now <tool_") == [{"content": " now"}]  # the tag's start is held back
    assert answer.deltas('call>{"name": "get_weather", "arguments": {"city"') == []  # the block until it closes
    start, arguments = answer.deltas(': "Oslo"}}</tool_call>')
    assert start["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ""}
    assert arguments == {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Oslo"}'}}]}
    assert answer.finish_reason("stop") == "tool_calls"


def test_an_answer_without_a_valid_call_finishes_as_text():
    answer = ToolCallAnswer(HERMES)
    assert answer.whole(block('{"name": "fly", "arguments": {}}'), "stop")[1:] == (None, "stop")


def test_named_call_starts_before_any_argument_text():
    answer = ToolCallAnswer(ToolCalling("named", "f"))
    (start,) = answer.deltas("")
    assert start["tool_calls"][0]["function"] == {"name": "f", "arguments": ""}
    assert json.loads(reassembled([start, *answer.deltas('{"x": 1}', last=True)])[1][0][2]) == {"x": 1}


def test_the_parsers_the_config_names_are_the_ones_that_exist():
    assert sorted(p.value for p in ToolCallParser) == sorted(PARSERS)
