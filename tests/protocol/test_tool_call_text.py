"""Tool calls read out of an answer's text, whole and in stream pieces (tool_call_text.py, tool_answers.py):
the pieces of every split reassemble into the whole answer."""
import json

import pytest

from appliance.config.schema import ToolCallParser
from appliance.protocol.openai_tools import ToolCalling
from appliance.protocol.tool_answers import ToolCallAnswer
from appliance.protocol.tool_call_text import PARSERS

HERMES = ToolCalling("auto", parser="hermes")
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


CASES = [  # (calling, text, content, [(name, arguments)])
    (ToolCalling("named", "get_weather"), '{"city": "Oslo"}', None, [("get_weather", '{"city": "Oslo"}')]),
    (ToolCalling("required"), '[{"name": "a", "parameters": {"x": [1, "]}"]}}, {"name": "b", "parameters": {}}]',
     None, [("a", '{"x": [1, "]}"]}'), ("b", "{}")]),
    (HERMES, TWO_CALLS, "Let me look.", [("get_weather", '{"city": "Paris \\"<x>\\"", "days": [1, {"n": 2}]}'),
                                          ("get_time", "{}")]),
    (HERMES, "No call here, 1 < 2 and <tool", "No call here, 1 < 2 and <tool", []),
    (HERMES, 'a <tool_call>{"no_name": 1}</tool_call> b', 'a <tool_call>{"no_name": 1}</tool_call> b', []),
    (HERMES, '<tool_call>{"name": "f", "arguments": {"q": "ab', None, [("f", '{"q": "ab')]),  # cut by max_tokens
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


def test_hermes_text_before_a_call_streams_before_the_call_ends():
    answer = ToolCallAnswer(HERMES)
    assert answer.deltas("Checking") == [{"content": "Checking"}]
    assert answer.deltas(" now <tool_") == [{"content": " now"}]  # the tag's start is held back
    first = answer.deltas('call>{"name": "f", "arguments": {"a"')
    assert first[0]["tool_calls"][0]["function"] == {"name": "f", "arguments": ""}
    assert first[1]["tool_calls"][0]["function"] == {"arguments": '{"a"'}
    assert answer.deltas(': 1}}</tool_call>') == [{"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}]
    assert answer.finish_reason("stop") == "tool_calls"


def test_named_call_starts_before_any_argument_text():
    answer = ToolCallAnswer(ToolCalling("named", "f"))
    (start,) = answer.deltas("")
    assert start["tool_calls"][0]["function"] == {"name": "f", "arguments": ""}
    assert json.loads(reassembled([start, *answer.deltas('{"x": 1}', last=True)])[1][0][2]) == {"x": 1}


def test_the_parsers_the_config_names_are_the_ones_that_exist():
    assert sorted(p.value for p in ToolCallParser) == sorted(PARSERS)
