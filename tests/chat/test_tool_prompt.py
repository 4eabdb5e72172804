"""Tools, tool calls and tool results in the prompt (tool_prompt.py): through a template that knows tools,
and the Hermes-format fallback for one that does not (the tiny LLaVA's)."""
import copy
import json

import pytest
from transformers import AutoTokenizer

from appliance.stages.chat.template import render_text, template_messages
from appliance.stages.chat.tool_prompt import with_tools
from tests.servers import LLAVA_TINY

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
CALLS = [{"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
         {"id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]
CHAT = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": CALLS},
        {"role": "tool", "tool_call_id": "call_a", "content": "12 C"},
        {"role": "tool", "tool_call_id": "call_b", "content": [{"type": "text", "text": "25 C"}]}]
# A template that knows tools, as Hermes' does (shortened).
TOOL_TEMPLATE = ("{% if tools %}TOOLS {{ tools | tojson }}\n{% endif %}{% for m in messages %}{{ m.role }}: "
                 "{% if m.tool_calls %}{% for c in m.tool_calls %}CALL {{ c.function.name }} "
                 "{{ c.function.arguments | tojson }} {% endfor %}{% elif m.role == 'tool' %}"
                 "RESULT {{ m.tool_call_id }} {{ m.content }}{% else %}{{ m.content }}{% endif %}\n{% endfor %}")


@pytest.fixture(scope="module")
def tokenizer():
    if not (LLAVA_TINY / "tokenizer.json").is_file():
        pytest.skip("appliance/assets/models/llava_tiny is missing")
    return AutoTokenizer.from_pretrained(LLAVA_TINY)


def rendered(tokenizer, messages, tools, describe=False):
    chat, template_tools = with_tools(messages, tools, tokenizer, describe)
    return render_text(tokenizer, template_messages(chat, parts=False)[0], tools=template_tools)


def test_a_template_without_tools_gets_calls_and_results_in_the_hermes_format(tokenizer):
    text = rendered(tokenizer, CHAT, TOOLS)
    assert 'ASSISTANT: <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>' in text
    results = ('USER: <tool_response>\n{"name": "get_weather", "content": "12 C"}\n</tool_response>\n'
               '<tool_response>\n{"name": "get_weather", "content": "25 C"}\n</tool_response>')
    assert results in text  # a run of results is one user turn
    assert "<tools>" not in text  # a named or required choice: the grammar writes the call
    assert text.endswith("ASSISTANT:")


def test_the_fallback_describes_the_tools_when_the_model_chooses(tokenizer):
    system = [{"role": "system", "content": "Be brief."}, CHAT[0]]
    text = rendered(tokenizer, system, TOOLS, describe=True)
    assert text.startswith("Be brief.\n\nYou may call one or more of these functions:\n<tools>\n"
                           + json.dumps(TOOLS[0]) + "\n</tools>")
    assert rendered(tokenizer, CHAT[:1], TOOLS, describe=True).startswith("You may call")  # a system message of its own


def test_a_template_that_knows_tools_gets_them_and_the_calls_arguments_as_objects(tokenizer):
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = TOOL_TEMPLATE
    text = rendered(tokenizer, CHAT, TOOLS)
    assert text.startswith(f"TOOLS {json.dumps(TOOLS)}\n")
    assert 'assistant: CALL get_weather {"city": "Oslo"} CALL get_weather {"city": "Rome"} ' in text  # objects
    assert "tool: RESULT call_a 12 C" in text and "tool: RESULT call_b 25 C" in text


def test_messages_without_tools_are_left_as_they_are(tokenizer):
    assert with_tools(CHAT[:1], None, tokenizer) == (CHAT[:1], None)
