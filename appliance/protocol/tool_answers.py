"""A tool-calling answer in OpenAI's (and vLLM's) shapes: `message.tool_calls` of a whole answer,
`delta.tool_calls` of a stream, and the finish reason.

A call's first delta carries its `index`, `id`, `type` and `function.name` with `arguments` ""; the
deltas after it append to `function.arguments`. An answer that holds a call and ended on its own
finishes with "tool_calls" (one cut by max_tokens keeps "length"). The text is read by the parser the
request's `ToolCalling` picks (tool_call_text.py), one per answer.
"""
from typing import Any, Dict, List, Optional, Tuple

from appliance.protocol.openai_responses import new_id
from appliance.protocol.openai_tools import ToolCalling
from appliance.protocol.tool_call_text import Piece, parser_for


def call_id() -> str:
    return new_id("call", "_")


class ToolCallAnswer:
    """One answer (choice) of a request with tool calling."""

    def __init__(self, calling: ToolCalling):
        self.parser = parser_for(calling)
        self.calls = 0

    def deltas(self, text: str, last: bool = False) -> List[Dict[str, Any]]:
        """The stream deltas of the answer's next `text`; `last`: its end (held-back text comes out)."""
        pieces = self.parser.feed(text) + (self.parser.finish() if last else [])
        return [delta for piece in pieces for delta in self._deltas(piece)]

    def finish_reason(self, reason: Optional[str]) -> Optional[str]:
        return "tool_calls" if self.calls and reason == "stop" else reason

    def whole(self, text: str, reason: Optional[str]) -> Tuple[Optional[str], Optional[List[Dict[str, Any]]],
                                                                Optional[str]]:
        """(content or None, tool_calls or None, finish_reason) of a whole answer."""
        content, calls = "", []
        for delta in self.deltas(text, last=True):
            content += delta.get("content", "")
            for call in delta.get("tool_calls", ()):
                if "id" in call:
                    calls.append({"id": call["id"], "type": "function", "function": dict(call["function"])})
                else:
                    calls[call["index"]]["function"]["arguments"] += call["function"]["arguments"]
        return content or None, calls or None, self.finish_reason(reason)

    def _deltas(self, piece: Piece) -> List[Dict[str, Any]]:
        if piece.content:
            return [{"content": piece.content}]
        out = []
        if piece.name is not None:
            self.calls += 1
            out.append({"tool_calls": [{"index": piece.index, "id": call_id(), "type": "function",
                                        "function": {"name": piece.name, "arguments": ""}}]})
        if piece.arguments:
            out.append({"tool_calls": [{"index": piece.index, "function": {"arguments": piece.arguments}}]})
        return out
