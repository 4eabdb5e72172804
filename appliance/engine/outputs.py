"""What the engines hand back to callers."""
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch


@dataclass
class RequestOutput:
    """One request's progress after a step. `new_*` hold this step's delta; the rest is cumulative."""

    request_id: str
    prompt_token_ids: List[int]
    new_text: str = ""
    new_token_ids: List[int] = field(default_factory=list)
    new_logprobs: Optional[List[Dict[int, float]]] = None
    text: str = ""
    token_ids: List[int] = field(default_factory=list)
    logprobs: Optional[List[Dict[int, float]]] = None  # per token: {sampled: lp, top-N...}
    # prompt_logprobs: per prompt token {token: lp, top-N...}, the first None (nothing predicts it)
    prompt_logprobs: Optional[List[Optional[Dict[int, float]]]] = None
    finished: bool = False
    finish_reason: Optional[str] = None  # stop | length | abort


@dataclass
class PoolOutput:
    """Pool-mode result: one output tensor per input item, stacked, once every item has run."""

    request_id: str
    output: Optional[torch.Tensor] = None
    finished: bool = False
    finish_reason: Optional[str] = None  # done | abort
