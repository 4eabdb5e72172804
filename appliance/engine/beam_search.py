"""Beam search as vLLM serves it, as plain state: which beams live, which finished, which win.

Each round every live beam proposes its 2 x width most likely next tokens (as vLLM and transformers
gather 2 x num_beams candidates, so that width of them survive whatever ends; more with several EOS
ids). A candidate ending on EOS is a finished beam; the width best of the others, by cumulative
logprob, live on. After `max_tokens` rounds the finished and the live beams are ranked by
`cum_logprob / length ** length_penalty`, where length counts the prompt and the output without its
EOS (vLLM's `get_beam_search_score`), and the width best are the answers. Running the beams is
beam_runs.py's job.
"""
import math
from dataclasses import dataclass
from typing import Collection, Dict, List, Optional, Sequence, Tuple


@dataclass(frozen=True)
class BeamSearchParams:
    width: int                    # beams kept each round, and answers returned (a request's `n`)
    max_tokens: int               # rounds: output tokens of the longest beam
    length_penalty: float         # the exponent of the length in the final ranking (requests: default 1.0)
    ignore_eos: bool = False      # EOS is a token like any other: no beam finishes before max_tokens

    def __post_init__(self):
        if self.width < 1 or self.max_tokens < 1:
            raise ValueError(f"beam search needs width >= 1 and max_tokens >= 1, got {self.width}, "
                             f"{self.max_tokens}")


@dataclass(frozen=True)
class Beam:
    tokens: Tuple[int, ...]               # output tokens; a finished beam's last is its EOS
    cum_logprob: float
    finish_reason: Optional[str] = None   # "stop" (ended on EOS), "length" (ran max_tokens), None: live


class BeamSearch:
    """One prompt's search: `advance` it with each live beam's next-token logprobs until `done`."""

    def __init__(self, prompt_len: int, params: BeamSearchParams, eos_token_ids: Collection[int]):
        self.prompt_len = prompt_len
        self.params = params
        self.eos_token_ids = frozenset(() if params.ignore_eos else eos_token_ids)
        self.live: List[Beam] = [Beam((), 0.0)]
        self.finished: List[Beam] = []
        self.rounds = 0

    @property
    def candidates(self) -> int:
        """Next tokens each live beam proposes a round (its top logprobs): 2 x width with one EOS id, more
        with several (as transformers counts them), so that width of one beam's alone never end."""
        return max(2, 1 + len(self.eos_token_ids)) * self.params.width

    @property
    def done(self) -> bool:
        return self.rounds >= self.params.max_tokens

    def advance(self, next_logprobs: Sequence[Dict[int, float]]) -> None:
        """`next_logprobs[i]`: {token: logprob} of live beam i's next token, its top candidates."""
        if len(next_logprobs) != len(self.live):
            raise ValueError(f"{len(next_logprobs)} logprob entries for {len(self.live)} live beams")
        growing = []
        for beam, entry in zip(self.live, next_logprobs):
            for token, logprob in entry.items():
                grown = Beam(beam.tokens + (token,), beam.cum_logprob + logprob)
                if token in self.eos_token_ids:
                    self.finished.append(Beam(grown.tokens, grown.cum_logprob, "stop"))
                else:
                    growing.append(grown)
        growing.sort(key=lambda b: b.cum_logprob, reverse=True)  # stable: ties keep beam, then rank, order
        self.live = growing[:self.params.width]
        self.rounds += 1

    def score(self, beam: Beam) -> float:
        length = self.prompt_len + len(beam.tokens) - (beam.finish_reason == "stop")
        try:
            return beam.cum_logprob / (length ** self.params.length_penalty)
        except OverflowError:  # a penalty so large the power passes float's range: every score is 0
            return 0.0
        except ZeroDivisionError:  # so negative it underflows to 0: any loss at all is infinite
            return -math.inf if beam.cum_logprob < 0 else 0.0

    def best(self) -> List[Beam]:
        """The width best beams, finished or not, best first (the answers once `done`)."""
        ended = [Beam(b.tokens, b.cum_logprob, "length") for b in self.live]
        return sorted(self.finished + ended, key=self.score, reverse=True)[:self.params.width]
