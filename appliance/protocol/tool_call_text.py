"""An answer's text -> tool calls, piece by piece as it streams: each parser takes the text as it comes
(`feed`) and says what is new (`Piece`s): content text, a call's start (its name), more of a call's
arguments. A whole answer is its text fed once, then `finish`: the same parser, so a stream and a whole
answer always agree.

- `NamedCall`: the whole text is one call's arguments (a named tool choice).
- `RequiredCalls`: the text is a JSON array of `{"name", "parameters"}` objects (`tool_choice: required`).
- `HermesCalls`: free text with `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (the
  `hermes` parser of `auto`); text outside the blocks is content (whitespace at either end left out), a
  block that names no function stays content as written.

Arguments are passed on as the model wrote them (JSON text); an answer cut by max_tokens has them cut too.
"""
import json
from dataclasses import dataclass
from typing import List, Optional

PARSERS = ("hermes",)  # what model.tool_call_parser may name


@dataclass
class Piece:
    """New output: `content` text, or for call `index` its start (`name`) and/or more `arguments`."""
    content: str = ""
    index: int = -1
    name: Optional[str] = None
    arguments: str = ""


@dataclass
class ScannedCall:
    name: Optional[str] = None
    arguments: str = ""
    sent_name: bool = False  # its start went out
    sent: int = 0            # characters of `arguments` that went out
    complete: bool = False   # its object closed


class CallObjects:
    """Finds call objects `{name_key: "...", args_key: <any JSON>}` in JSON text fed in pieces: the one
    top-level object, or each item of a top-level array (`in_array`). A character-level scanner (depth,
    strings, keys at the call's own level), so pieces may split anywhere and keys come in any order."""

    def __init__(self, name_key: str, args_key: str, in_array: bool):
        self.name_key, self.args_key = name_key, args_key
        self.outer = 1 if in_array else 0  # depth outside a call object's braces
        self.depth = 0
        self.in_string = self.escape = False
        self.calls: List[ScannedCall] = []
        self.state = ""   # at a call's own level: "key", "colon", "value-start", "value"
        self.key = ""     # the member being read (its JSON text while state is "key")
        self.name_text = ""

    def feed(self, text: str) -> None:
        for char in text:
            self._char(char)

    def _char(self, char: str) -> None:
        member_level = self.depth == self.outer + 1
        if member_level and self.state == "value-start" and not self.in_string and not char.isspace():
            self.state = "value"  # this character starts the value
        if self.state == "value" and self.key == self.args_key and not (
                member_level and not self.in_string and char in ",}"):
            self.calls[-1].arguments += char
        if self.state == "value" and self.key == self.name_key and (self.in_string or char == '"'):
            self.name_text += char
        if self.in_string:
            self._string_char(char, member_level)
            return
        if char == '"':
            self.in_string = True
            if member_level and self.state == "key":
                self.key = char
            return
        if member_level and self.state == "colon" and char == ":":
            self.state = "value-start"
        elif char in "{[":
            if char == "{" and self.depth == self.outer:
                self.calls.append(ScannedCall())
                self.state = "key"
            self.depth += 1
        elif char in "}]":
            self.depth -= 1
            if member_level and char == "}":
                self.calls[-1].complete = True
                self.state = ""
        elif member_level and char == "," and self.state == "value":
            self.state = "key"

    def _string_char(self, char: str, member_level: bool) -> None:
        if self.escape:
            self.escape = False
        elif char == "\\":
            self.escape = True
        elif char == '"':
            self.in_string = False
        if member_level and self.state == "key":
            self.key += char
            if not self.in_string:
                self.key, self.state = _loads(self.key), "colon"
        elif member_level and self.state == "value" and self.key == self.name_key and not self.in_string:
            name = _loads(self.name_text)
            self.calls[-1].name = name if isinstance(name, str) else None
            self.name_text = ""


def _loads(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def new_pieces(calls: List[ScannedCall], first_index: int = 0) -> List[Piece]:
    """What is new in `calls` since last asked: a call's start once its name is known, then its arguments."""
    out = []
    for i, call in enumerate(calls):
        if call.name is None:
            continue
        piece = Piece(index=first_index + i)
        if not call.sent_name:
            call.sent_name = True
            piece.name = call.name
        if len(call.arguments) > call.sent:
            piece.arguments, call.sent = call.arguments[call.sent:], len(call.arguments)
        if piece.name is not None or piece.arguments:
            out.append(piece)
    return out


class NamedCall:
    def __init__(self, name: str):
        self.name, self.started = name, False

    def feed(self, text: str) -> List[Piece]:
        piece = Piece(index=0, arguments=text, name=None if self.started else self.name)
        self.started = True
        return [piece] if piece.name is not None or text else []

    def finish(self) -> List[Piece]:
        return self.feed("")


class RequiredCalls:
    def __init__(self):
        self.scanner = CallObjects("name", "parameters", in_array=True)

    def feed(self, text: str) -> List[Piece]:
        self.scanner.feed(text)
        return new_pieces(self.scanner.calls)

    def finish(self) -> List[Piece]:
        return []


class HermesCalls:
    START, END = "<tool_call>", "</tool_call>"

    def __init__(self):
        self.pending = ""        # text not yet classified (it may start a tag)
        self.block: Optional[CallObjects] = None  # the open block's scanner
        self.block_text = ""     # the open block's text, for a block that names no function
        self.calls = 0           # calls started before the open block
        self.spaces = ""         # content whitespace held back: it goes out only before more content
        self.content_started = False

    def feed(self, text: str) -> List[Piece]:
        self.pending += text
        out: List[Piece] = []
        while True:
            if self.block is None:
                at = self.pending.find(self.START)
                end = at if at >= 0 else len(self.pending) - _partial_tag(self.pending, self.START)
                out += self._content(self.pending[:end])
                if at < 0:
                    self.pending = self.pending[end:]
                    return out
                self.pending = self.pending[at + len(self.START):]
                self.block, self.block_text = CallObjects("name", "arguments", in_array=False), ""
            else:
                at = self.pending.find(self.END)
                end = at if at >= 0 else len(self.pending) - _partial_tag(self.pending, self.END)
                self.block.feed(self.pending[:end])
                self.block_text += self.pending[:end]
                out += new_pieces(self.block.calls[:1], self.calls)
                if at < 0:
                    self.pending = self.pending[end:]
                    return out
                self.pending = self.pending[at + len(self.END):]
                out += self._close_block()

    def finish(self) -> List[Piece]:
        out = self.feed("")
        if self.block is not None:  # cut off inside a block
            self.block.feed(self.pending)
            self.block_text += self.pending
            out += new_pieces(self.block.calls[:1], self.calls) + self._close_block(closed=False)
        elif self.pending:
            out += self._content(self.pending)
        self.pending = ""
        return out

    def _close_block(self, closed: bool = True) -> List[Piece]:
        named = bool(self.block.calls) and self.block.calls[0].name is not None
        text = self.START + self.block_text + (self.END if closed else "")
        self.block = None
        if named:
            self.calls += 1
            return []
        return self._content(text)

    def _content(self, text: str) -> List[Piece]:
        if not text:
            return []
        text = self.spaces + text
        body = text.rstrip()
        self.spaces = text[len(body):]
        if not self.content_started:
            body = body.lstrip()
        if not body:
            return []
        self.content_started = True
        return [Piece(content=body)]


def _partial_tag(text: str, tag: str) -> int:
    """How many characters at the end of `text` could begin `tag` (held back until the next piece)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


def parser_for(calling):
    """A fresh parser for one answer of a request whose `ToolCalling` is `calling`."""
    if calling.mode == "named":
        return NamedCall(calling.name)
    if calling.mode == "required":
        return RequiredCalls()
    if calling.parser == "hermes":
        return HermesCalls()
    raise ValueError(f"tool-call parser {calling.parser!r}; allowed: {', '.join(PARSERS)}")
