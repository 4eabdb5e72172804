"""Tools and tool messages in a chat prompt: the request's `tools`, assistant messages with `tool_calls`
and `role: "tool"` results.

A chat template that knows tools (its source names `tools`, as Hermes', Qwen's and Llama 3.1's do) gets
them as transformers passes them (`apply_chat_template(tools=...)`), each call's arguments as an
object, as vLLM hands them over. Any other template gets a fallback in plain messages, in the Hermes
format, so a model sees its past calls as it would write them (docs/serving.md):
- the tools, when the model is to choose (`describe`: tool_choice "auto"): a system message (after the
  first system message's own text, if there is one), the function definitions as JSON lines in
  `<tools></tools>` and how to call one. A named or required choice has the grammar write the call, and
  a template without tools would not show them either (as in vLLM), so the context is left to the chat;
- an assistant message's calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` after its text;
- tool results: one user message per run of results,
  `<tool_response>{"name": ..., "content": ...}</tool_response>` each.
"""
import json
from typing import Any, Dict, List, Optional, Tuple

PREAMBLE = ("You may call one or more of these functions:\n<tools>\n{tools}\n</tools>\nTo call one, write its "
            "name and arguments as JSON inside <tool_call></tool_call> tags:\n<tool_call>\n{{\"name\": <function "
            "name>, \"arguments\": <arguments object>}}\n</tool_call>")


def with_tools(messages: List[Dict[str, Any]], tools: Optional[List[Dict[str, Any]]], tokenizer,
               describe: bool = False) -> Tuple[List[Dict[str, Any]], Optional[List[Dict[str, Any]]]]:
    """(messages, tools for the template): unchanged when there are neither tools nor tool messages;
    `describe`: a template without tools gets them in a system message."""
    if not tools and not any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
        return messages, None
    if knows_tools(tokenizer):
        return [_arguments_as_objects(m) for m in messages], tools or None
    return fallback_messages(messages, tools if tools and describe else []), None


def knows_tools(tokenizer) -> bool:
    template = getattr(tokenizer, "chat_template", None)
    return "tools" in (json.dumps(template) if isinstance(template, dict) else str(template or ""))


def _arguments_as_objects(message: Dict[str, Any]) -> Dict[str, Any]:
    if not message.get("tool_calls"):
        return message
    calls = [{**call, "function": {**call["function"], "arguments": _object(call["function"]["arguments"])}}
             for call in message["tool_calls"]]
    return {**message, "tool_calls": calls}


def fallback_messages(messages: List[Dict[str, Any]], tools: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    names = {call["id"]: call["function"]["name"] for m in messages for call in m.get("tool_calls") or ()}
    out: List[Dict[str, Any]] = []
    for message in messages:
        if message["role"] == "tool":
            response = {"name": names.get(message["tool_call_id"]), "content": _text(message["content"])}
            block = f"<tool_response>\n{json.dumps(response, ensure_ascii=False)}\n</tool_response>"
            if out and out[-1].get("tool_results"):  # a run of results: one user turn
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "tool_results": True})
        elif message.get("tool_calls"):
            calls = "".join(f"<tool_call>\n{json.dumps(_call(c), ensure_ascii=False)}\n</tool_call>"
                            for c in message["tool_calls"])
            text = _text(message.get("content") or "")
            out.append({"role": message["role"], "content": f"{text}\n{calls}" if text else calls})
        else:
            out.append(message)
    out = [{k: v for k, v in m.items() if k != "tool_results"} for m in out]
    if tools:
        out = _with_preamble(out, PREAMBLE.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools)))
    return out


def _with_preamble(messages: List[Dict[str, Any]], preamble: str) -> List[Dict[str, Any]]:
    first = messages[0] if messages else None
    if first is not None and first["role"] in ("system", "developer"):
        content = first["content"]
        joined = f"{content}\n\n{preamble}" if isinstance(content, str) \
            else [*content, {"type": "text", "text": f"\n\n{preamble}"}]
        return [{**first, "content": joined}, *messages[1:]]
    return [{"role": "system", "content": preamble}, *messages]


def _call(call: Dict[str, Any]) -> Dict[str, Any]:
    return {"name": call["function"]["name"], "arguments": _object(call["function"]["arguments"])}


def _object(arguments: str) -> Any:
    """A call's arguments as an object; text that is not JSON stays text."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _text(content: Any) -> str:
    return content if isinstance(content, str) else "".join(p["text"] for p in content if p["type"] == "text")
