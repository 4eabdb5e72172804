"""What the engine loop keeps about each generation request it serves: a `Session` per request, an
`ChoiceState` per choice (one engine request each: a request asking `n` answers to each of its prompts
holds n per prompt), and how engine request ids name them."""
from dataclasses import dataclass, field
from typing import Dict, List

from appliance.protocol.openai_requests import GenerateRequest
from appliance.protocol.openai_responses import TokenLogprob


@dataclass
class ChoiceState:
    """One choice of a request: one engine request."""
    index: int                       # prompt number * n + answer number
    prompt: int                      # its prompt's number
    prompt_tokens: int = 0           # its prompt's length
    completion_tokens: int = 0
    last_token_at: float = 0.0
    echoed: bool = False             # its prompt (echo) went out, in front of its first text
    # A stream's output not sent yet (server.stream_interval > 1 holds tokens back between chunks).
    unsent_text: str = ""
    unsent_tokens: int = 0
    unsent_logprobs: List = field(default_factory=list)


@dataclass
class Session:
    request: GenerateRequest
    arrival: float
    in_engine: bool = False
    prompt_tokens: int = 0           # every prompt once
    completion_tokens: int = 0       # every answer's
    started_at: float = 0.0          # the start of the first engine step that ran it
    first_token_at: float = 0.0      # of any answer
    answers: Dict[str, ChoiceState] = field(default_factory=dict)  # by engine id
    unfinished: int = 0              # answers still running
    # echo: each prompt's text, and (with logprobs) its scored tokens, which its first answer brings
    echo_texts: List[str] = field(default_factory=list)
    echo_logprobs: Dict[int, List[TokenLogprob]] = field(default_factory=dict)


def engine_id(uid: str, index: int) -> str:
    """The engine's id for choice `index` of request `uid` (ids the HTTP side makes hold no "/")."""
    return f"{uid}/{index}"


def request_of(engine_request_id: str) -> str:
    return engine_request_id.rpartition("/")[0]
