"""Structured output: a grammar constrains what a request may generate (a JSON schema, any JSON object,
a regex, one of a list of strings, an EBNF/GBNF or Lark grammar).

llguidance compiles the grammar against the engine's tokenizer; each step, the rows that sample get a
token bitmask (bit t of row r set: token t may follow), computed while the model's forward runs, and
the sampler sends every other token's logit to -inf. A request's matcher then consumes the token it
sampled; once the grammar is complete the request stops ("stop"), and `max_tokens` ends it mid-way
("length"), as OpenAI's API does.
"""
import concurrent.futures
import json
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Literal, Optional, Sequence

import torch

if TYPE_CHECKING:  # imported where a grammar is first compiled
    import llguidance

# The kinds llguidance compiles from their text, by its name for each; json goes through its JSON schema compiler.
TEXT_FORMATS: Dict[str, Literal["regex", "choice", "grammar"]] = {
    "regex": "regex", "choice": "choice", "grammar": "grammar"}
KINDS = ("json", *TEXT_FORMATS)


@dataclass(frozen=True)
class StructuredOutput:
    """What a request's output must match. `spec`: the JSON schema as JSON text (`json`), the regex
    (`regex`), the choices as a JSON list of strings (`choice`), or the grammar text (`grammar`)."""

    kind: str
    spec: str

    def grammar(self) -> str:
        """llguidance's grammar text; ValueError naming the problem when it cannot compile."""
        import llguidance

        if self.kind not in KINDS:
            raise ValueError(f"structured output kind {self.kind!r}; allowed: {', '.join(KINDS)}")
        if self.kind == "json":
            try:
                json.loads(self.spec)
            except ValueError as e:
                raise ValueError(f"the JSON schema is not JSON: {e}") from None
        try:
            if self.kind == "json":  # JSON as json.dumps writes it: a schema's own x-guidance options win
                # Separators as json.dumps writes them, and no free whitespace: a model cannot pad its answer
                # with newlines until max_tokens, and the text reads as the JSON models are trained on.
                grammar = llguidance.LLMatcher.grammar_from_json_schema(self.spec, defaults={
                    "whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "})
            else:
                grammar = llguidance.grammar_from(TEXT_FORMATS[self.kind], self.spec)
        except (ValueError, TypeError) as e:
            raise ValueError(f"cannot read the {self.kind}: {e}") from None
        error = llguidance.LLMatcher.validate_grammar(grammar)
        if error:
            raise ValueError(f"the {self.kind} cannot compile: {_first_line(error)}")
        return grammar

    def check(self) -> None:
        """Raises ValueError when the grammar cannot compile (needs no tokenizer: cheap on the HTTP side)."""
        self.grammar()


def json_object() -> StructuredOutput:
    """Any JSON object (OpenAI's `response_format: {"type": "json_object"}`)."""
    return StructuredOutput("json", '{"type": "object"}')


class GrammarMatchers:
    """One engine's grammar machinery: its tokenizer in llguidance's form, compiled grammars kept by
    spec (least recently used dropped past `capacity`), and a thread that fills a step's masks while the
    forward runs."""

    def __init__(self, hf_tokenizer, vocab_size: int, capacity: int = 64):
        self.hf_tokenizer, self.vocab_size, self.capacity = hf_tokenizer, vocab_size, capacity
        self.words = (vocab_size + 31) // 32  # int32 words a row's bitmask takes
        # built on the first structured request (it walks the whole vocab)
        self._tokenizer: Optional["llguidance.LLTokenizer"] = None
        self._compiled: "OrderedDict[StructuredOutput, llguidance.LLMatcher]" = OrderedDict()
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")
        self.fill_seconds = 0.0  # time the mask thread spent filling masks (what overlapping the forward hides)

    def matcher(self, structured: StructuredOutput):
        """A fresh matcher for one sequence (a copy of the compiled grammar); ValueError if it cannot compile."""
        import llguidance

        template = self._compiled.get(structured)
        if template is None:
            template = llguidance.LLMatcher(self._llg_tokenizer(), structured.grammar(), log_level=0)
            if template.is_error():
                raise ValueError(f"the {structured.kind} cannot compile: {_first_line(template.get_error())}")
            self._compiled[structured] = template
            if len(self._compiled) > self.capacity:
                self._compiled.popitem(last=False)
        self._compiled.move_to_end(structured)
        return template.deep_copy()

    def cached(self) -> List[StructuredOutput]:
        """The grammars compiled and kept, least recently used first."""
        return list(self._compiled)

    def _llg_tokenizer(self):
        if self._tokenizer is None:
            import llguidance.hf

            self._tokenizer = llguidance.hf.from_tokenizer(self.hf_tokenizer, n_vocab=self.vocab_size)
        return self._tokenizer

    def start_masks(self, matchers: Sequence[Optional[object]]) -> Optional["concurrent.futures.Future"]:
        """Begin filling the masks of a step's sampling rows (`matchers[i]`: row i's matcher or None) on
        the mask thread; None when no row is constrained. `.result()` is `StepMasks`."""
        rows = [(m, i) for i, m in enumerate(matchers) if m is not None]
        if not rows:
            return None
        return self._thread.submit(self._fill, rows)

    def _fill(self, rows) -> "StepMasks":
        start = time.perf_counter()
        bitmask = torch.zeros((len(rows), self.words), dtype=torch.int32)
        for k, (matcher, _) in enumerate(rows):  # llguidance writes each mask in place, without the GIL
            matcher.unsafe_compute_mask_ptr(bitmask[k].data_ptr(), self.words * 4)
        masks = StepMasks([i for _, i in rows], allowed_tokens(bitmask, self.vocab_size))
        self.fill_seconds += time.perf_counter() - start
        return masks

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)


@dataclass
class StepMasks:
    """The constrained rows of a step's sampling batch and, per row, which tokens may follow."""

    rows: List[int]
    allowed: torch.Tensor  # bool [len(rows), vocab]


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool [R, vocab] from llguidance's int32 bitmask [R, ceil(vocab / 32)] (bit b of word w: token 32w + b)."""
    shifts = torch.arange(32, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def _first_line(text: str) -> str:
    return next((line.strip() for line in str(text).splitlines() if line.strip()), str(text))
