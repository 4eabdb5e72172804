"""The `engine` stage: the one stage that owns the model.

Pool mode (`engine.kind=pool`): each record's tensor is one item; items from consecutive records (tiles
of one or many scenes) are batched up to `engine.max_batch_size` per forward (pooling.py, the rule `serve`
follows too). A record's `coords` (a `GeoCoords`, on the tiles of a scene for a model with time and
location encodings) go with its item. Generate mode: each
record's prompt becomes a request (`n` of them when the record asks `n` answers: the first and its
siblings, the prompt computed once); all requests in the stream are batched continuously.
Records come out in the order they went in, with the engine's result added (`completion`: the first
answer; `choices`: all `n`). The stage is the engine's one handle: `appliance run` and `serve`'s drivers
add, step and abort requests through it (`add_request`, `add_item`, `step`, `abort`, `has_unfinished`).

The engine owns the model's tokenizer and context length. `model_tokenizer` and `model_context` give
every stage of a pipeline (and the server) that one tokenizer, loaded once, and the engine's own rule
for the context; `check_fits` words the rule for "the prompt fits" (`answer_room`, engine/scheduler.py)
for the user, and
`check_text_fits` applies it before tokenizing a text too long to fit (a 10 MB prompt is refused at once,
not after seconds of tokenizer work).
"""
import os
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Deque, Dict, Iterator, List, Optional, Tuple, Union, cast

from omegaconf import DictConfig, OmegaConf

from appliance.config.schema import EngineKind
from appliance.config.typed import typed_dataclass
from appliance.engine.beam_search import BeamSearchParams
from appliance.engine.sampling_params import SamplingParams, over_defaults
from appliance.engine.scheduler import answer_room
from appliance.errors import ConfigError, InputError
from appliance.pipeline import Record, Stage, register_stage
from appliance.progress import DEFAULT_INTERVAL, Progress, check_interval
from appliance.stages.pooling import EngineSteps, pool_in_order

if TYPE_CHECKING:  # each imported where its kind of engine is built
    from appliance.engine.llm_engine import LLMEngine
    from appliance.engine.pool_engine import PoolEngine


@dataclass
class PoolEngineOptions:
    """The engine stage's options with engine.kind=pool."""

    applies_to: ClassVar[str] = "engine.kind=pool"
    input: str = "tensor"  # record field holding one item [C, H, W]
    output: str = "logits"  # record field receiving the model's output for the item


@dataclass
class GenerateEngineOptions:
    """The engine stage's options with engine.kind=generate."""

    applies_to: ClassVar[str] = "engine.kind=generate"
    sampling: Dict[str, Any] = field(default_factory=dict)  # default SamplingParams fields
    progress: bool = True  # a batch: answers done, tokens/s and ETA on stderr (appliance/progress.py)
    progress_interval: float = DEFAULT_INTERVAL  # seconds between progress lines when stderr is not a terminal


@dataclass
class EngineStageOptions(GenerateEngineOptions, PoolEngineOptions):
    """Every option of the stage; a pipeline's node takes those of its engine kind (`options_for`)."""

    applies_to: ClassVar[str] = "any engine kind"


def sampling_defaults(cfg) -> Dict[str, Any]:
    """The engine stage's `sampling` in the configured pipeline: what a request's own fields override."""
    for stage_id, node in cfg.pipeline.stages.items():
        if node is not None and node.get("stage", stage_id) == "engine":
            sampling = node.get("sampling")
            return dict(cast(Dict[str, Any], OmegaConf.to_container(sampling)) if isinstance(sampling, DictConfig)
                        else sampling or {})
    return {}


def answer_sampling(sampling: Dict[str, Any], answer: int) -> Dict[str, Any]:
    """The sampling of answer `answer` (0-based) of a request asking `n` answers to one prompt: a seed S
    becomes S + answer (as vLLM derives its child requests' seeds), so the answers differ from each other
    and the same request gives the same n answers again. Without a seed each answer draws its own.
    Only the first answer scores the prompt (`prompt_logprobs`): a scoring request takes no prefix-cache
    hits, and its siblings share its computed prompt."""
    if not answer:
        return sampling
    seed = sampling.get("seed")
    sibling = {k: v for k, v in sampling.items() if k != "prompt_logprobs"}
    return sibling if seed is None else {**sibling, "seed": seed + answer}


def check_sampling(sampling: Dict[str, Any], where: str) -> None:
    """ConfigError naming the field when `sampling` (SamplingParams fields) could never make a request."""
    typed_dataclass(SamplingParams, sampling, where, "sampling field")


def model_tokenizer(stage: Stage):
    """The pipeline's one tokenizer (the engine's), loaded by whichever stage asks first."""
    def load():
        from appliance.engine.llm_engine import load_tokenizer

        if not stage.cfg.model.path:
            raise ConfigError("model.path: required for a language model (an HF directory with the tokenizer)")
        return load_tokenizer(stage.cfg.model.path)

    return stage.shared.get("tokenizer", load)


def model_text_config(stage: Stage):
    """The language model's config (transformers' text config of the checkpoint), read once per pipeline."""
    def load():
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(stage.cfg.model.path).get_text_config()

    return stage.shared.get("text_config", load)


def model_context(stage: Stage) -> int:
    """Tokens a sequence may hold (prompt and answer): `engine.max_model_len` checked against the model by
    the engine's own rule; ConfigError when it exceeds the model's limit."""
    def compute():
        from appliance.engine.model_fit import max_model_len

        try:
            return max_model_len(model_text_config(stage), stage.cfg.engine.get("max_model_len"))
        except ValueError as e:
            raise ConfigError(str(e)) from None

    return stage.shared.get("max_model_len", compute)


def check_fits(prompt_tokens: int, limit: int, where: str, fix: str, detail: str = "",
               max_tokens: Optional[int] = None, param: Optional[str] = None) -> None:
    """InputError unless the prompt leaves room for at least one generated token (the engine refuses a
    prompt of `limit` tokens or more) and, when `max_tokens` is given, the whole answer fits too."""
    room = answer_room(prompt_tokens, limit)
    if room < 1:
        raise InputError(f"{where}: the prompt is {prompt_tokens} tokens{detail}; the model's context is {limit} "
                         f"tokens and the answer needs at least one; {fix}", param=param)
    if max_tokens is not None and max_tokens > room:
        raise InputError(f"max_tokens: the prompt is {prompt_tokens} tokens and max_tokens is {max_tokens}, "
                         f"{prompt_tokens + max_tokens} in all; the model's context is {limit} tokens, so "
                         f"max_tokens may be at most {room}", param="max_tokens")


def model_longest_token(stage: Stage) -> int:
    """`longest_token` of the pipeline's one tokenizer, computed once per pipeline."""
    return stage.shared.get("longest_token", lambda: longest_token(model_tokenizer(stage)))


def longest_token(tokenizer) -> int:
    """Characters in the longest vocabulary entry. No token stands for more non-space characters of a
    text (a byte-level or byte-fallback entry is at least as long as what it decodes to), so a text with
    C non-space characters is at least C / this many tokens, whatever the tokenizer does with spaces."""
    return max(map(len, tokenizer.get_vocab()), default=1)


def check_text_fits(text: str, longest: int, limit: int, where: str, param: Optional[str] = None) -> None:
    """InputError when `text` cannot fit the context whatever its tokenization (see `longest_token`)."""
    at_least = len("".join(text.split())) // max(longest, 1)
    if at_least >= limit:
        raise InputError(f"{where}: the prompt is {len(text)} characters, at least {at_least} tokens; the "
                         f"model's context is {limit} tokens; shorten it", param=param)


def prompt_token_ids(stage: Stage, prompt: Union[str, List[int]], field: str) -> List[int]:
    """A completion's prompt, text or token ids, as the token ids the engine runs: a text is encoded by
    the pipeline's tokenizer with its special tokens (BOS for Llama-family tokenizers, as vLLM does), after
    `check_text_fits` refused one too long to fit; token ids are taken as given, inside the vocabulary."""
    if isinstance(prompt, str):
        check_text_fits(prompt, model_longest_token(stage), model_context(stage), field, param=field)
        return list(model_tokenizer(stage).encode(prompt))
    vocab_size = model_text_config(stage).vocab_size
    bad = [t for t in prompt if t >= vocab_size]
    if bad:
        raise InputError(f"{field}: token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})", param=field)
    return prompt


def answers_progress(total: int, label: str, options: EngineStageOptions) -> Progress:
    """Answers done of `total`, generated tokens/s and an ETA on stderr, for a batch (more than one answer)."""
    return Progress(total, label, "answer", rate_unit="token", interval=options.progress_interval,
                    enabled=options.progress and total > 1)


@register_stage
class EngineStage(Stage):
    name = "engine"
    Options = EngineStageOptions

    @classmethod
    def options_for(cls, cfg) -> type:
        """Pool engines take `input`/`output`, generating ones `sampling`: `appliance config` shows only
        those, and an override of the other kind's is refused."""
        return PoolEngineOptions if cfg.engine.kind == EngineKind.pool else GenerateEngineOptions

    def __init__(self, options: EngineStageOptions, cfg):
        super().__init__(options, cfg)
        self.pool_mode = cfg.engine.kind == EngineKind.pool
        if self.pool_mode:
            self.consumes, self.produces = (options.input,), (options.output,)
        else:
            self.consumes, self.produces = ("prompt",), ("completion", "choices")
            check_sampling(options.sampling, f"{self.name}.sampling")
            check_interval(options.progress_interval, f"{self.name}.progress_interval")
        self.engine: Optional[Union["PoolEngine", "LLMEngine"]] = None

    def check(self) -> None:
        """The model fits this machine: the engine's own sizing rule (engine/model_fit.py) on the model's
        files, so `check` and `run` refuse with the engine's line before any weight loads."""
        from appliance.engine.config import engine_config_from
        from appliance.engine.model_fit import engine_host, generate_fit, pool_fit

        engine = engine_config_from(self.cfg.engine)
        host = engine_host(engine)
        if self.pool_mode:
            pool_fit(engine, self.cfg.model, host)
        else:
            generate_fit(engine, str(self.cfg.model.path), model_text_config(self), host, model_context(self))

    def setup(self) -> None:
        if self.pool_mode:
            from appliance.engine.pool_engine import PoolEngine
            self.engine = PoolEngine.from_config(self.cfg)
        else:
            from appliance.engine.llm_engine import LLMEngine
            self.engine = LLMEngine.from_config(self.cfg, tokenizer=model_tokenizer(self))

    def _running(self) -> Union["PoolEngine", "LLMEngine"]:
        if self.engine is None:
            raise RuntimeError(f"stage {self.name}: no engine yet; setup() builds it")
        return self.engine

    def pooling_engine(self) -> "PoolEngine":
        from appliance.engine.pool_engine import PoolEngine

        engine = self._running()
        if not isinstance(engine, PoolEngine):
            raise RuntimeError(f"stage {self.name}: a pool request reached a generating engine")
        return engine

    def generating_engine(self) -> "LLMEngine":
        from appliance.engine.llm_engine import LLMEngine

        engine = self._running()
        if not isinstance(engine, LLMEngine):
            raise RuntimeError(f"stage {self.name}: a prompt reached a pool engine")
        return engine

    def process(self, records: Iterator[Record]) -> Iterator[Record]:
        return self._pool(records) if self.pool_mode else self._generate(records)

    def _pool(self, records: Iterator[Record]) -> Iterator[Record]:
        return pool_in_order(records, EngineSteps(self), self.options.input, self.options.output,
                             window=self.pooling_engine().cfg.max_batch_size)

    def _generate(self, records: Iterator[Record]) -> Iterator[Record]:
        pending: Deque[Tuple[List[str], Record]] = deque()
        results: Dict[str, Any] = {}
        for record in records:
            ids: List[str] = []
            try:
                for answer in range(record.get("n") or 1):
                    ids.append(self.add_request(record["prompt"], record.get("sampling"), "prompt",
                                                mm_ranges=record.get("mm_ranges"), mm_data=record.get("mm_data"),
                                                answer=answer, sibling=ids[0] if ids else None))
            except InputError as e:  # the engine's own checks: name the request (a batch file's line)
                where = record.get("where")
                raise InputError(f"{where}: {e}" if where else str(e), param=e.param) from None
            pending.append((ids, record))
        progress = answers_progress(sum(len(ids) for ids, _ in pending), self._batch_name(), self.options)
        try:
            while self.has_unfinished():
                outputs = self.step()
                done = {out.request_id: out for out in outputs if out.finished}
                results.update(done)
                progress.update(len(done), sum(len(out.new_token_ids) for out in outputs))
        finally:
            progress.close()
        for ids, record in pending:
            choices = [results.pop(request_id) for request_id in ids]
            yield {**record, "completion": choices[0], "choices": choices}

    def _batch_name(self) -> str:
        """How progress names the batch: the run's input file (requests.jsonl), else `answers`."""
        source = self.cfg.get("input")
        return os.path.basename(source) if isinstance(source, str) else "answers"

    # ---- the engine's requests: `appliance run` (above) and `appliance serve`'s drivers go through these ----
    def add_item(self, item, coords=None) -> str:
        """Queue one pool item (a tile [C, H, W]) with the coordinates it carries; returns its request id."""
        return self.pooling_engine().add_request([item], coords=coords)

    def step(self) -> list:
        """One engine step: its outputs (pool: the requests finished; generate: every running one's)."""
        return self._running().step()

    def has_unfinished(self) -> bool:
        return self._running().has_unfinished()

    def abort(self, request_id: str) -> None:
        self._running().abort(request_id)

    def add_request(self, prompt: List[int], sampling: Optional[Dict[str, Any]], field: str,
                    request_id: Optional[str] = None, mm_ranges=None, mm_data=None, answer: int = 0,
                    sibling: Optional[str] = None) -> str:
        """Queue one prompt with the request's `sampling` over this stage's; returns its id. InputError
        naming the field at fault (`field` when the engine does not say: the prompt's).
        `answer`: which of a request's `n` answers to this prompt (`answer_sampling`); `sibling`: the
        id of its first answer, added just before (the prompt is then computed once)."""
        try:
            params = SamplingParams(**answer_sampling(over_defaults(self.options.sampling, sampling or {}), answer))
        except (TypeError, ValueError) as e:
            raise InputError(f"sampling: {e}", param="sampling") from None
        engine = self.generating_engine()
        try:
            return engine.add_request(prompt, params, request_id=request_id, mm_ranges=mm_ranges,
                                      mm_data=mm_data, sibling=sibling)
        except ValueError as e:  # e.g. a prompt longer than the model's context
            named = getattr(e, "field", None)  # a FieldError names the request field at fault
            raise InputError(str(e) if named else f"{field}: {e}", param=named or field) from None

    def add_beam_search(self, prompt: List[int], sampling: Optional[Dict[str, Any]], length_penalty: float,
                        answer_ids: List[str], field: str, mm_data=None) -> None:
        """Queue a beam search of width len(answer_ids) (the request's `n`) over `prompt`: its answers come
        out as those ids' outputs, best first. `max_tokens` and `ignore_eos` are the request's over this
        stage's; absent, the search runs to the end of the context (vLLM's default). InputError naming
        the field at fault."""
        sampling = over_defaults(self.options.sampling, sampling or {})
        engine = self.generating_engine()
        max_tokens = sampling.get("max_tokens") or answer_room(len(prompt), engine.max_model_len)
        params = BeamSearchParams(len(answer_ids), max_tokens, length_penalty, bool(sampling.get("ignore_eos")))
        try:
            engine.add_beam_search(prompt, params, answer_ids, mm_data=mm_data)
        except ValueError as e:
            named = getattr(e, "field", None)
            raise InputError(str(e) if named else f"{field}: {e}", param=named or field) from None

    def prompt_ids(self, prompt: Union[str, List[int]], field: str = "prompt") -> List[int]:
        """`prompt_token_ids` (the server's completions; offline, `chat_prompt` calls it)."""
        return prompt_token_ids(self, prompt, field)

    def check_fits(self, prompt_tokens: int, max_tokens: Optional[int], field: str) -> None:
        """`check_fits` against this engine's context, naming `field`."""
        check_fits(prompt_tokens, self.generating_engine().max_model_len, field, "shorten it", max_tokens=max_tokens,
                   param=field)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
