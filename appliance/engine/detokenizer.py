"""Incremental detokenization and stop-string handling for one request."""
from typing import List, Optional, Sequence


class IncrementalDetokenizer:
    """Turns a growing list of output token ids into text deltas.

    Each call decodes a short window: tokens from `prefix` (context already shown) to the end, and
    emits what the window adds beyond the text of [prefix, read). A window ending in U+FFFD means a
    multi-byte character is split across tokens, so nothing is emitted until the next token completes
    it. Decoding a window with context (rather than single tokens) keeps leading spaces right for
    tokenizers that drop them at the start of a decode. `context_ids`: the prompt ids the text continues
    (its first word then keeps the space joining it to them); empty: the output is decoded alone, its
    text that of `tokenizer.decode(output ids)`.
    """

    def __init__(self, tokenizer, context_ids: Sequence[int], stop: Sequence[str] = ()):
        self.tokenizer = tokenizer
        self.ids: List[int] = list(context_ids[-4:])  # a little prompt context for spacing
        self.prefix = 0
        self.read = len(self.ids)
        self.text = ""
        self.stop = list(stop)
        self.stopped = False

    def add(self, token_id: int, check_stop: bool = True) -> str:
        """Append one token and return the new text (possibly empty; always empty once stopped).
        `check_stop=False` (before a request's min_tokens) appends without looking for stop strings."""
        if self.stopped:
            return ""
        self.ids.append(token_id)
        before = self._decode(self.ids[self.prefix:self.read])
        after = self._decode(self.ids[self.prefix:])
        if after.endswith("\ufffd") or len(after) <= len(before):
            return ""
        delta = after[len(before):]
        self.prefix, self.read = self.read, len(self.ids)
        if not check_stop:
            self.text += delta
            return delta
        return self._append(delta)

    def flush(self) -> str:
        """At the end of a request: emit what was held back, even an incomplete character (as U+FFFD)."""
        if self.stopped or self.read == len(self.ids):
            return ""
        before = self._decode(self.ids[self.prefix:self.read])
        after = self._decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return self._append(after[len(before):])

    def _append(self, delta: str) -> str:
        start = max(0, len(self.text) - max((len(s) for s in self.stop), default=0) + 1)
        self.text += delta
        cut = self._find_stop(start)
        if cut is None:
            return delta
        # The stop string and anything after it are not part of the output.
        emitted = len(self.text) - len(delta)
        self.text = self.text[:cut]
        self.stopped = True
        return self.text[emitted:] if cut > emitted else ""

    def _find_stop(self, start: int) -> Optional[int]:
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        return min(hits) if hits else None

    def _decode(self, ids: List[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
