"""Per-request sampling settings."""
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from appliance.engine.structured_output import StructuredOutput
from appliance.errors import PROBLEMS_JOIN

LOGIT_BIAS_LIMIT = 100.0  # OpenAI's bound on a logit_bias value


class FieldError(ValueError):
    """A request setting the engine refuses, naming it (`field`: the SamplingParams field, which is the
    request body's field of the same name), so a server answers 400 with that `param`."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


class SamplingError(ValueError):
    """Settings `SamplingParams` refuses: every one, as (field, message naming it); `field` the first."""

    def __init__(self, problems: List[Tuple[str, str]]):
        super().__init__(PROBLEMS_JOIN.join(message for _, message in problems))
        self.problems = problems
        self.field = problems[0][0]


@dataclass
class SamplingParams:
    """How one request picks its tokens and when it stops.

    temperature=0 means greedy. top_k=0 and top_p=1.0 disable those filters. `logprobs=N` returns the
    sampled token's log-probability plus the top N, computed from the raw (untempered, unmasked) logits.
    `logit_bias` ({token id: bias}) is added to the logits before any token is picked; `structured`
    constrains the output to a grammar (structured_output.py). `decode_after_prompt`: the output's text
    continues the prompt's, so a first word keeps the space that joins it to the prompt (a completion, as
    vLLM and OpenAI give it); False: the output ids decoded alone, as transformers' `decode` gives them
    (a chat answer, which starts a new turn rather than continuing the prompt's text).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: Optional[int] = None
    max_tokens: Optional[int] = None  # None: until EOS, a stop, or the end of the context (vLLM's default)
    stop_token_ids: List[int] = field(default_factory=list)
    stop: List[str] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0  # EOS and stop_token_ids are suppressed, and stop strings unchecked, until this many
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None  # each prompt token's logprob (after the first) plus the top N
    logit_bias: Dict[int, float] = field(default_factory=dict)
    structured: Optional[StructuredOutput] = None
    decode_after_prompt: bool = True

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        problems = self.problems()
        if problems:
            raise SamplingError(problems)

    def problems(self) -> List[Tuple[str, str]]:
        """Every setting out of its range, as (field, message naming the field)."""
        checks = [
            ("temperature", self.temperature < 0, f"temperature must be >= 0 (0 = greedy), got {self.temperature}"),
            ("top_k", self.top_k < 0, f"top_k must be >= 0 (0 = disabled), got {self.top_k}"),
            ("top_p", not 0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}"),
            ("max_tokens", self.max_tokens is not None and self.max_tokens < 1,
             f"max_tokens must be >= 1, got {self.max_tokens}"),
            ("min_tokens", self.min_tokens < 0 or (self.max_tokens is not None and self.min_tokens > self.max_tokens),
             f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}"),
            ("logprobs", self.logprobs is not None and self.logprobs < 0,
             f"logprobs must be >= 0 or None, got {self.logprobs}"),
            ("prompt_logprobs", self.prompt_logprobs is not None and self.prompt_logprobs < 0,
             f"prompt_logprobs must be >= 0 or None, got {self.prompt_logprobs}"),
            ("stop", any(not s for s in self.stop), "stop strings must be non-empty"),
        ]
        checks += [(f"logit_bias[{token}]", not -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT,
                    f"logit_bias[{token}] must be in [-100, 100], got {bias}")
                   for token, bias in self.logit_bias.items()]
        return [(name, message) for name, bad, message in checks if bad]

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def over_defaults(defaults: Dict[str, Any], request: Dict[str, Any]) -> Dict[str, Any]:
    """A request's sampling settings over the pipeline's defaults (the engine stage's `sampling`): each
    setting the request gives wins, the others keep the default. The one rule, offline and served."""
    return {**defaults, **request}
