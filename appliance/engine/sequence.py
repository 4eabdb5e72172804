"""State of one generation request as it moves through the engine."""
from enum import Enum
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from appliance.engine.sampling_params import SamplingParams

if TYPE_CHECKING:  # a Sequence is plain Python; only its generator is torch's
    import torch

# (mm_hash, start, length): a run of placeholder tokens that stand for one multimodal item.
MMRange = Tuple[str, int, int]


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """Token ids (prompt + output), KV block table and progress of one request.

    `num_computed_tokens` counts tokens whose K/V are in the cache. Preemption resets it to 0 and keeps
    the tokens, so the request is recomputed later as if its output so far were part of the prompt.
    """

    def __init__(self, request_id: str, prompt_token_ids: List[int], sampling_params: SamplingParams,
                 arrival: int, mm_ranges: Optional[List[MMRange]] = None, mm_data=None):
        if not prompt_token_ids:
            raise ValueError(f"request {request_id!r} has an empty prompt; give at least one token")
        self.request_id = request_id
        self.token_ids: List[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.sampling_params = sampling_params
        self.arrival = arrival
        self.mm_ranges: List[MMRange] = list(mm_ranges or [])
        self.mm_data = mm_data  # opaque to the scheduler; the model runner hands it to the model
        self.status = SequenceStatus.WAITING
        self.block_table: List[int] = []
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prefix-cache hits at the last admission
        self.num_preemptions = 0
        self.finish_reason: Optional[str] = None
        self.generator: Optional["torch.Generator"] = None  # made by the engine when the request is added
        self.min_tokens_suppress: Tuple[int, ...] = ()  # EOS / stop ids masked until min_tokens (engine sets)
        self.matcher = None  # llguidance's matcher of a structured request (engine sets), fed each token
        self.sibling: Optional["Sequence"] = None  # the request whose prompt this one shares (n > 1)
        # One entry per output token: {token_id: logprob}, sampled token first.
        self.output_logprobs: List[Dict[int, float]] = []
        # prompt_logprobs: one entry per prompt token scored so far, the first (which nothing predicts) None.
        self.prompt_logprobs: List[Optional[Dict[int, float]]] = [None]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> List[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> List[int]:
        return self.token_ids[self.num_prompt_tokens:]

    def prompt_scoring(self, start: int, end: int) -> Tuple[int, int]:
        """(first position, count) among the step's positions [start, end) whose logits score the next
        prompt token: none unless the request asks for prompt_logprobs; positions scored before a
        preemption are not scored again."""
        if self.sampling_params.prompt_logprobs is None:
            return start, 0
        first = max(start, len(self.prompt_logprobs) - 1)
        return first, max(0, min(end, self.num_prompt_tokens - 1) - first)

    def suppressed_ids(self) -> Tuple[int, ...]:
        """Token ids the sampler must not pick at this step (stop tokens before `min_tokens`)."""
        return self.min_tokens_suppress if self.num_output_tokens < self.sampling_params.min_tokens else ()

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, {self.status.value}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, blocks={self.block_table})")
