"""OpenAI response bodies: chat.completion(.chunk), text_completion, usage, logprobs, errors.

Pure functions over plain values, shared by the offline batch verb (its output file holds
chat.completion bodies) and the server (answers and SSE chunks). Logprobs travel as `TokenLogprob`s:
the engine reports `{token_id: logprob}` per output token (sampled token first, then the top N);
`token_logprobs` turns them into text once, wherever the tokenizer lives. A request's answers are
`Choice`s: `n` per prompt, choice `index` = prompt number * n + answer number (as vLLM numbers them).
"""
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Literal, Optional, Sequence, Tuple, Union


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    logprob: Optional[float]  # None: a prompt's first token, which nothing predicts
    top: Tuple[Tuple[str, float], ...]  # the N most likely tokens, most likely first (may hold `token`)


@dataclass
class Choice:
    """One answer of a request: its whole text (an answer) or its new text (a chunk)."""
    index: int
    text: str
    finish_reason: Optional[str] = None
    logprobs: Optional[Sequence[TokenLogprob]] = None
    tool_calls: Optional[List[Dict[str, Any]]] = None  # a chat answer's tool calls (its text: content, or none)


def new_id(prefix: str, separator: str = "-") -> str:
    """A request's id: `prefix`, `separator` and 32 random hex digits (`chatcmpl-…` as vLLM's answers,
    `batch_req_…` as OpenAI's batch files). Every id the appliance hands out comes from here."""
    return f"{prefix}{separator}{uuid.uuid4().hex}"


def token_logprobs(token_ids: Sequence[int], logprobs: Sequence[Dict[int, float]], top_n: int,
                   decode: Callable[[int], str]) -> List[TokenLogprob]:
    """Engine logprobs (one dict per output token, sampled token first) -> `TokenLogprob`s."""
    out = []
    for token_id, entry in zip(token_ids, logprobs):
        ranked = sorted(entry.items(), key=lambda item: -item[1])[:top_n]  # the sampled one drops out if not top
        out.append(TokenLogprob(decode(token_id), float(entry[token_id]),
                                tuple((decode(t), float(lp)) for t, lp in ranked)))
    return out


def answer_logprobs(token_ids: Sequence[int], logprobs: Optional[Sequence[Dict[int, float]]], top_n: Optional[int],
                    decode: Callable[[int], str]) -> Optional[List[TokenLogprob]]:
    """An answer's (or a chunk's) logprobs as the request asked: None when it asked none (`top_n` None)
    or the engine reported none, else `token_logprobs`. The server and the batch verb both call this."""
    if top_n is None or logprobs is None:
        return None
    return token_logprobs(token_ids, logprobs, top_n, decode)


def prompt_token_logprobs(token_ids: Sequence[int], logprobs: Sequence[Optional[Dict[int, float]]], top_n: int,
                          decode: Callable[[int], str]) -> List[TokenLogprob]:
    """The engine's prompt logprobs (one entry per prompt token, the first None) -> `TokenLogprob`s."""
    first = [TokenLogprob(decode(token_ids[0]), None, ())] if logprobs and logprobs[0] is None else []
    scored: List[Dict[int, float]] = []
    for entry in logprobs[len(first):]:
        if entry is None:
            raise RuntimeError("prompt logprobs: only the first prompt token has none")
        scored.append(entry)
    return first + token_logprobs(token_ids[len(first):], scored, top_n, decode)


def echo_text(prompt: Union[str, Sequence[int]], detokenize: Callable[[Sequence[int]], str]) -> str:
    """What each answer of an echoing completion starts with: a text prompt as sent, a token-id prompt as
    its text (`detokenize`: the tokenizer's decode, special tokens skipped)."""
    return prompt if isinstance(prompt, str) else detokenize(prompt)


def with_echo(prompt_text: str, prompt_logprobs: Optional[List[TokenLogprob]], text: str,
              logprobs: Optional[List[TokenLogprob]]) -> Tuple[str, Optional[List[TokenLogprob]]]:
    """An echoing answer's text and logprobs (a stream: its first chunk's) with its prompt's in front; the
    prompt's logprobs (`prompt_token_logprobs`) come when the answer asked logprobs."""
    return prompt_text + text, None if logprobs is None else [*(prompt_logprobs or ()), *logprobs]


def token_decoder(tokenizer) -> Callable[[int], str]:
    """Token id -> its text as it reads inside an answer, leading space included. Decoding one id alone
    drops a SentencePiece word's leading space, so each id is decoded after an anchor token whose own
    text is then cut off."""
    anchor = tokenizer.encode("a", add_special_tokens=False)[-1:]
    anchor_text = tokenizer.decode(anchor)
    cache: Dict[int, str] = {}

    def decode(token_id: int) -> str:
        text = cache.get(token_id)
        if text is None:
            both = tokenizer.decode(anchor + [token_id])
            text = both[len(anchor_text):] if both.startswith(anchor_text) else tokenizer.decode([token_id])
            if len(cache) < 65536:
                cache[token_id] = text
        return text

    return decode


def usage(prompt_tokens: int, completion_tokens: int) -> Dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _bytes(text: str) -> List[int]:
    return list(text.encode("utf-8"))


def chat_logprobs(entries: Sequence[TokenLogprob]) -> Dict[str, Any]:
    return {"content": [{"token": e.token, "logprob": e.logprob, "bytes": _bytes(e.token),
                         "top_logprobs": [{"token": t, "logprob": lp, "bytes": _bytes(t)} for t, lp in e.top]}
                        for e in entries]}


def completion_logprobs(entries: Sequence[TokenLogprob], text_offset: int = 0) -> Dict[str, Any]:
    """The legacy completions format; `text_offset` is where the first token starts in the whole text.
    Each `top_logprobs` entry holds the sampled token too (so `logprobs: 0` gives just that one, as
    OpenAI's legacy API does); a prompt's first token has none (null)."""
    offsets = []
    for e in entries:
        offsets.append(text_offset)
        text_offset += len(e.token)
    return {"tokens": [e.token for e in entries], "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [None if e.logprob is None else {**dict(e.top), e.token: e.logprob} for e in entries],
            "text_offset": offsets}


def chat_completion(request_id: str, model: str, created: int, choices: Sequence[Choice],
                    usage_: Dict[str, int]) -> Dict[str, Any]:
    """The whole answer; its choices in index order, however they came."""
    choices = sorted(choices, key=lambda c: c.index)
    return {"id": request_id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": c.index, "message": _message(c),
                         "logprobs": chat_logprobs(c.logprobs) if c.logprobs is not None else None,
                         "finish_reason": c.finish_reason} for c in choices],
            "usage": usage_}


def _message(choice: Choice) -> Dict[str, Any]:
    if choice.tool_calls is None:
        return {"role": "assistant", "content": choice.text}
    return {"role": "assistant", "content": choice.text or None, "tool_calls": choice.tool_calls}


def chat_chunk(request_id: str, model: str, created: int, index: int, delta: Dict[str, Any],
               finish_reason: Optional[str] = None, logprobs: Optional[Sequence[TokenLogprob]] = None,
               usage_: Any = ...) -> Dict[str, Any]:
    """One `chat.completion.chunk` for choice `index`; `usage_` is left out unless given (None or a usage)."""
    chunk = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model,
             "choices": [{"index": index, "delta": delta,
                          "logprobs": chat_logprobs(logprobs) if logprobs is not None else None,
                          "finish_reason": finish_reason}]}
    if usage_ is not ...:
        chunk["usage"] = usage_
    return chunk


def text_completion(request_id: str, model: str, created: int, choices: Sequence[Choice],
                    usage_: Dict[str, int]) -> Dict[str, Any]:
    """The whole answer; its choices in index order, however they came."""
    choices = sorted(choices, key=lambda c: c.index)
    return {"id": request_id, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": c.index, "text": c.text,
                         "logprobs": completion_logprobs(c.logprobs) if c.logprobs is not None else None,
                         "finish_reason": c.finish_reason} for c in choices],
            "usage": usage_}


def text_chunk(request_id: str, model: str, created: int, index: int, text: str,
               finish_reason: Optional[str] = None, logprobs: Optional[Sequence[TokenLogprob]] = None,
               text_offset: int = 0, usage_: Any = ...) -> Dict[str, Any]:
    chunk = {"id": request_id, "object": "text_completion", "created": created, "model": model,
             "choices": [{"index": index, "text": text,
                          "logprobs": completion_logprobs(logprobs, text_offset) if logprobs is not None else None,
                          "finish_reason": finish_reason}]}
    if usage_ is not ...:
        chunk["usage"] = usage_
    return chunk


def usage_chunk(kind: str, request_id: str, model: str, created: int, usage_: Dict[str, int]) -> Dict[str, Any]:
    """The last chunk of a stream asked for `stream_options.include_usage`: no choices, the usage."""
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    return {"id": request_id, "object": obj, "created": created, "model": model, "choices": [], "usage": usage_}


# OpenAI's error types, sorted (the answers' schema lists them in this order)
ErrorType = Literal["AuthenticationError", "BadRequestError", "InternalServerError", "MethodNotAllowedError",
                    "NotFoundError", "RateLimitError", "RequestTooLargeError", "ServiceUnavailableError",
                    "TimeoutError"]
ERROR_TYPES: Dict[int, ErrorType] = {
    400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 405: "MethodNotAllowedError",
    413: "RequestTooLargeError", 422: "BadRequestError", 429: "RateLimitError", 500: "InternalServerError",
    503: "ServiceUnavailableError", 504: "TimeoutError"}


def error_body(status: int, message: str, param: Optional[str] = None) -> Dict[str, Any]:
    """OpenAI's error object, `code` the HTTP status (as vLLM answers)."""
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "BadRequestError" if status < 500
                                                                    else "InternalServerError"),
                      "param": param, "code": status}}
