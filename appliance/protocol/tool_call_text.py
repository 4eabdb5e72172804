"""An answer's text -> tool calls, piece by piece as it streams: each parser takes the text as it comes
(`feed`) and says what is new (`Piece`s): content text, a call's start (its name), more of a call's
arguments. A whole answer is its text fed once, then `finish`: the same parser, so a stream and a whole
answer always agree.

- `NamedCall`: the whole text is one call's arguments (a named tool choice).
- `RequiredCalls`: the text is a JSON array of `{"name", "parameters"}` objects (`tool_choice: required`),
  each a call once its object closes.
- `HermesCalls`: free text with `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (the
  `hermes` parser of `auto`); text outside the blocks is content (whitespace at either end left out), a
  block that is not a valid call of a declared tool stays content as written.

Arguments are passed on as the model wrote them (JSON text). Named and required answers are generated
by the grammar, so only max_tokens can cut them: a named call's arguments then are cut (they stream as
they come), a required answer's cut item is left out; an `auto` call is checked before it goes out.
"""
import json
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import jsonschema

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


def new_pieces(calls: List[ScannedCall]) -> List[Piece]:
    """What is new in `calls` since last asked: a call's start once its name is known, then its arguments."""
    out = []
    for i, call in enumerate(calls):
        if call.name is None:
            continue
        piece = Piece(index=i)
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
    """Each item goes out once its object closes (the grammar made it valid): an item max_tokens cuts is
    no call, and the calls before it stay whole (a model may add calls until max_tokens)."""

    def __init__(self):
        self.scanner = CallObjects("name", "parameters", in_array=True)

    def feed(self, text: str) -> List[Piece]:
        self.scanner.feed(text)
        return new_pieces([call for call in self.scanner.calls if call.complete])  # items close in order

    def finish(self) -> List[Piece]:
        return []


class HermesCalls:
    """`auto` answers in the Hermes format. A block is a call only when, once closed, it is one JSON object
    `{"name": <a declared tool>, "arguments": <an object valid for its schema>}` and, with
    `parallel: false`, no call came before it; any other block (and one max_tokens cut) stays content as
    written, as OpenAI never returns a call that does not parse. So a block is held back until it closes."""
    START, END = "<tool_call>", "</tool_call>"

    def __init__(self, schemas: Dict[str, Dict[str, Any]], parallel: bool):
        self.validators = {name: jsonschema.validators.validator_for(schema)(schema)
                           for name, schema in schemas.items()}
        self.parallel = parallel
        self.pending = ""        # text not yet classified (it may start a tag)
        self.block: Optional[str] = None  # the open block's text
        self.calls = 0           # calls made so far
        self.spaces = ""         # content whitespace held back: it goes out only before more content
        self.content_started = False

    def feed(self, text: str) -> List[Piece]:
        self.pending += text
        out: List[Piece] = []
        while True:
            tag = self.START if self.block is None else self.END
            at = self.pending.find(tag)
            end = at if at >= 0 else len(self.pending) - _partial_tag(self.pending, tag)
            if self.block is None:
                out += self._content(self.pending[:end])
            else:
                self.block += self.pending[:end]
            if at < 0:
                self.pending = self.pending[end:]
                return out
            self.pending = self.pending[at + len(tag):]
            if self.block is None:
                self.block = ""
            else:
                out += self._close_block(self.block)

    def finish(self) -> List[Piece]:
        out = self.feed("")
        if self.block is not None:  # cut off inside a block: not a call
            out += self._content(self.START + self.block + self.pending)
        elif self.pending:
            out += self._content(self.pending)
        self.block, self.pending = None, ""
        return out

    def _close_block(self, text: str) -> List[Piece]:
        self.block = None
        call = self._call(text)
        if call is None:
            return self._content(self.START + text + self.END)
        self.calls += 1
        return [Piece(index=self.calls - 1, name=call.name, arguments=call.arguments)]

    def _call(self, text: str) -> Optional[ScannedCall]:
        """The block's call, or None when it is not one this request accepts."""
        value = _loads(text)
        if not isinstance(value, dict) or set(value) != {"name", "arguments"} or not self.parallel and self.calls:
            return None
        validator = self.validators.get(value["name"]) if isinstance(value["name"], str) else None
        if validator is None or not validator.is_valid(value["arguments"]):
            return None
        scanner = CallObjects("name", "arguments", in_array=False)
        scanner.feed(text)
        (call,) = scanner.calls
        call.arguments = call.arguments.strip()  # as written, less the space before the closing brace
        return call

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
        return HermesCalls({name: json.loads(schema) for name, schema in calling.schemas}, calling.parallel)
    raise ValueError(f"tool-call parser {calling.parser!r}; allowed: {', '.join(PARSERS)}")
