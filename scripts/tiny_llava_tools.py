"""What the tool-calling tiny LLaVA (appliance/assets/models/llava_tiny_tools) knows: its chat template
(LLaVA-1.5's, with a Hermes-style tool block in front), its three tools, the requests that call them and
the answers it gives. scripts/train_tiny_llava_tools.py trains on these; the tests send the same tools.
"""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic_shapes import COLORS, SHAPES
from tiny_llava_files import CHAT_TEMPLATE, tokenizer_corpus

MAX_POSITIONS = 1024  # RoPE: no weights depend on it; a tool list needs more room than 256

# The tools, rendered as the Hermes and Qwen2.5 templates do (one JSON object a line inside <tools>),
# keys sorted so that every client's key order gives the same text; an assistant's earlier calls as
# <tool_call> blocks after its text, tool results as TOOL: turns.
TOOLS_HEAD = "You may call these tools:\n<tools>\n"
TOOLS_TAIL = ("</tools>\nTo call one, answer <tool_call>\n"
              "{\"name\": <tool name>, \"arguments\": <arguments>}\n</tool_call> ")
CALLS = ("{% for call in message['tool_calls'] or [] %}"
         "{{ '<tool_call>\n{\"name\": ' + call['function']['name'] | tojson + ', \"arguments\": ' "
         "+ call['function']['arguments'] | tojson(sort_keys=True) + '}\n</tool_call> ' }}{% endfor %}")
_LOOP_END = "{% endfor %}{% if add_generation_prompt %}"
assert CHAT_TEMPLATE.count(_LOOP_END) == 1
CHAT_TEMPLATE_TOOLS = ("{% if tools %}" + TOOLS_HEAD
                       + "{% for tool in tools %}{{ tool | tojson(sort_keys=True) + '\n' }}{% endfor %}"
                       + TOOLS_TAIL + "{% endif %}" + CHAT_TEMPLATE.replace(_LOOP_END, CALLS + _LOOP_END))

TOOLS = {
    "draw_shape": {"type": "function", "function": {
        "name": "draw_shape", "description": "Draw one shape in one colour.",
        "parameters": {"type": "object", "properties": {"shape": {"type": "string", "enum": list(SHAPES)},
                                                        "color": {"type": "string", "enum": sorted(COLORS)}},
                       "required": ["shape", "color"]}}},
    "resize_shape": {"type": "function", "function": {
        "name": "resize_shape", "description": "Make the shape in the image bigger or smaller.",
        "parameters": {"type": "object", "properties": {"direction": {"type": "string", "enum": ["bigger", "smaller"]}},
                       "required": ["direction"]}}},
    "get_weather": {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city today.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
}
DRAW_REQUESTS = ("Draw a {color} {shape}.", "Please draw a {color} {shape}.", "Can you draw a {color} {shape}?",
                 "Paint a {color} {shape}.", "Make a {color} {shape}.")
RESIZE_REQUESTS = ("Make the shape {direction}.", "Make it {direction}.", "Please make the shape {direction}.",
                   "Can you make the shape {direction}?")
NO_TOOL_ANSWERS = {"draw_shape": "I cannot draw: no drawing tool was given.",
                   "resize_shape": "I cannot resize the shape: no tool for that was given."}


def tool_call(name: str, arguments: dict) -> str:
    """One call as the hermes parser reads it (the template writes past calls the same way)."""
    call = f"{{\"name\": {json.dumps(name)}, \"arguments\": {json.dumps(arguments, sort_keys=True)}}}"
    return f"<tool_call>\n{call}\n</tool_call>"


def request(tool: str, rng: random.Random) -> tuple[str, dict]:
    """(request text, the arguments that answer it) for `tool`, phrasing and values drawn from `rng`."""
    if tool == "draw_shape":
        arguments = {"color": rng.choice(sorted(COLORS)), "shape": rng.choice(SHAPES)}
        return rng.choice(DRAW_REQUESTS).format(**arguments), arguments
    arguments = {"direction": rng.choice(("bigger", "smaller"))}
    return rng.choice(RESIZE_REQUESTS).format(**arguments), arguments


def tool_list(rng: random.Random, must: str | None = None, without: str | None = None) -> list[dict]:
    """A shuffled subset of TOOLS (possibly empty) holding `must` and lacking `without`; a tool's
    description is left out now and then, as some clients send none."""
    names = [n for n in TOOLS if n != without and (n == must or rng.random() < 0.5)]
    rng.shuffle(names)
    tools = []
    for name in names:
        tool = json.loads(json.dumps(TOOLS[name]))
        if rng.random() < 0.2:
            del tool["function"]["description"]
        tools.append(tool)
    return tools


def corpus() -> list[str]:
    """tokenizer_corpus() plus every tool definition, request and answer, for the BPE merges."""
    lines = [json.dumps(t, sort_keys=True) for t in TOOLS.values()]
    lines += [json.dumps({k: v for k, v in t.items() if k != "description"}, sort_keys=True)
              for t in (tool["function"] for tool in TOOLS.values())]
    lines += [TOOLS_HEAD, TOOLS_TAIL, *NO_TOOL_ANSWERS.values()]
    lines += [r.format(color=c, shape=s) for r in DRAW_REQUESTS for c in COLORS for s in SHAPES]
    lines += [r.format(direction=d) for r in RESIZE_REQUESTS for d in ("bigger", "smaller")]
    lines += [tool_call("draw_shape", {"color": c, "shape": s}) for c in COLORS for s in SHAPES]
    lines += [tool_call("resize_shape", {"direction": d}) for d in ("bigger", "smaller")]
    return tokenizer_corpus() + lines
