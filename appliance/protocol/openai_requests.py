"""OpenAI request bodies (chat completions, completions) -> a checked `GenerateRequest`.

One parser serves the offline batch verb (`appliance run ... input=requests.jsonl`, each line's `body`)
and the server's `/v1/chat/completions` and `/v1/completions`. Every problem is an `InputError` whose
message starts with the field's path (`temperature: expected a number, got 'hot'`; in a batch file
`line 3: body.temperature: ...`) and whose `param` is the field's name. Fields a request leaves out take
the pipeline's defaults (the engine stage's `sampling`), not OpenAI's.
"""
import json
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

from appliance.engine.sampling_params import SamplingParams
from appliance.engine.structured_output import StructuredOutput, json_object
from appliance.errors import InputError

ROLES = ("system", "developer", "user", "assistant")  # developer: OpenAI's name for system in newer models
MAX_LOGPROBS = 20  # as vLLM's default max_logprobs
# body field -> SamplingParams field. top_k, min_tokens, ignore_eos, stop_token_ids extend OpenAI, as in vLLM.
SAMPLING_FIELDS = {"max_tokens": "max_tokens", "max_completion_tokens": "max_tokens", "temperature": "temperature",
                   "top_p": "top_p", "top_k": "top_k", "seed": "seed", "min_tokens": "min_tokens",
                   "ignore_eos": "ignore_eos", "stop": "stop", "stop_token_ids": "stop_token_ids"}
FLOAT_FIELDS = ("temperature", "top_p")
INT_FIELDS = ("max_tokens", "max_completion_tokens", "top_k", "seed", "min_tokens", "top_logprobs")
MAX_N = 128  # answers per prompt (`n`), as vLLM's bound
# Fields OpenAI clients may send that we accept only at their neutral value.
NEUTRAL_FIELDS = {"frequency_penalty": (0,), "presence_penalty": (0,), "best_of": (1,), "suffix": (None, "")}
# vLLM's structured_outputs: exactly one of these, as vLLM's StructuredOutputsParams has them.
STRUCTURED_KINDS = ("json", "regex", "choice", "grammar")
COMMON_FIELDS = ("model", "stream", "stream_options", "user", *SAMPLING_FIELDS, "n", "frequency_penalty",
                 "presence_penalty", "logit_bias", "response_format", "structured_outputs")
CHAT_FIELDS = ("messages", "logprobs", "top_logprobs", *COMMON_FIELDS)
COMPLETION_FIELDS = ("prompt", "logprobs", "echo", "best_of", "suffix", *COMMON_FIELDS)


@dataclass
class GenerateRequest:
    kind: str                                    # "chat" | "completion"
    sampling: Dict[str, Any]                     # SamplingParams fields the request sets
    model: Optional[str] = None                  # body.model, checked by the server, echoed in answers
    messages: Optional[List[Dict[str, Any]]] = None   # chat: validated OpenAI messages
    prompts: List[Union[str, List[int]]] = field(default_factory=list)  # completion: texts or token-id lists
    n: int = 1                                   # answers per prompt
    echo: bool = False                           # completion: each answer starts with its prompt
    stream: bool = False
    include_usage: bool = False                  # stream_options.include_usage: a last chunk with usage
    continuous_usage: bool = False               # stream_options.continuous_usage_stats: usage on every chunk
    top_logprobs: Optional[int] = field(default=None)  # None: no logprobs; N: sampled token's plus the top N


def path(at: str, key: Any) -> str:
    """`at.key` (or `at[key]` for indexes); just `key` at the top of a body."""
    if isinstance(key, int):
        return f"{at}[{key}]"
    return f"{at}.{key}" if at else str(key)


def fail(at: str, key: Any, message: str) -> InputError:
    where = path(at, key)
    param = where.split(": ")[-1]  # a batch file's `line 3: body.x` -> `body.x`
    return InputError(f"{where}: {message}", param=param)


def parse_chat(body: Any, defaults: Optional[Dict[str, Any]] = None, at: str = "",
               allow_stream: bool = True) -> GenerateRequest:
    """A chat completion request body; `defaults` are the pipeline's sampling defaults."""
    body = _object(body, at)
    _known(body, CHAT_FIELDS, at)
    if "messages" not in body:
        raise fail(at, "messages", "required, a non-empty list of {role, content} messages")
    request = _common(body, "chat", defaults or {}, at, allow_stream)
    request.messages = check_messages(body["messages"], path(at, "messages"))
    logprobs, top = body.get("logprobs"), body.get("top_logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise fail(at, "logprobs", f"expected true or false, got {logprobs!r}")
    if top is not None:
        top = _integer(at, "top_logprobs", top)
        if not logprobs:
            raise fail(at, "top_logprobs", "needs logprobs: true")
        if not 0 <= top <= MAX_LOGPROBS:
            raise fail(at, "top_logprobs", f"{top}; allowed: 0 to {MAX_LOGPROBS}")
    if logprobs:
        request.top_logprobs = top or 0
    return _with_logprobs(request)


def parse_completion(body: Any, defaults: Optional[Dict[str, Any]] = None, at: str = "",
                     allow_stream: bool = True) -> GenerateRequest:
    """A (legacy) completion request body: one prompt or a list of them, each text or token ids."""
    body = _object(body, at)
    _known(body, COMPLETION_FIELDS, at)
    request = _common(body, "completion", defaults or {}, at, allow_stream)
    request.prompts = _prompts(body.get("prompt"), at)
    echo = body.get("echo")
    if echo is not None and not isinstance(echo, bool):
        raise fail(at, "echo", f"expected true or false, got {echo!r}")
    request.echo = bool(echo)
    logprobs = body.get("logprobs")
    if logprobs is not None:
        logprobs = _integer(at, "logprobs", logprobs)
        if not 0 <= logprobs <= MAX_LOGPROBS:
            raise fail(at, "logprobs", f"{logprobs}; allowed: 0 to {MAX_LOGPROBS}")
        request.top_logprobs = logprobs
    return _with_logprobs(request)


def check_messages(messages: Any, at: str) -> List[Dict[str, Any]]:
    """OpenAI chat messages: roles system/user/assistant; content a string or text / image_url parts."""
    if not isinstance(messages, list) or not messages:
        raise InputError(f"{at}: required, a non-empty list of {{role, content}} messages", param=at)
    for i, message in enumerate(messages):
        where = path(at, i)
        if not isinstance(message, dict):
            raise fail(at, i, f"expected an object {{role, content}}, got {type(message).__name__}")
        if message.get("role") not in ROLES:
            raise fail(where, "role", f"{message.get('role')!r}; allowed: {', '.join(ROLES)}")
        content = message.get("content")  # other keys of a message are ignored, as vLLM does
        if isinstance(content, str):
            continue
        if not isinstance(content, list) or not content:
            raise fail(where, "content", "expected a string or a non-empty list of parts")
        for j, part in enumerate(content):
            check_part(part, path(path(where, "content"), j))
    return messages


def check_part(part: Any, at: str) -> None:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise fail(at, "text", "required, a string")
    elif kind == "image_url":
        url = image_url(part)
        if not isinstance(url, str) or not url:
            raise fail(at, "image_url.url", "required, a data:image/...;base64 URL, an http(s) URL or a path "
                                            "inside the allowed media directory")
    else:
        raise fail(at, "type", f"{kind!r}; allowed: text, image_url")


def image_url(part: Dict[str, Any]) -> Any:
    """The URL of an image_url part: `{"image_url": {"url": ...}}` (or the bare string some clients send)."""
    value = part.get("image_url")
    return value.get("url") if isinstance(value, dict) else value


# ---- pieces ----------------------------------------------------------------------------------------

def _object(body: Any, at: str) -> Dict[str, Any]:
    if not isinstance(body, dict):
        raise InputError(f"{at or 'body'}: expected a JSON object, got {type(body).__name__}", param=at or None)
    return body


def _known(body: Dict[str, Any], allowed, at: str) -> None:
    for key in body:
        if key not in allowed:
            raise fail(at, key, f"unknown or unsupported field; allowed: {', '.join(sorted(set(allowed)))}")


def _common(body: Dict[str, Any], kind: str, defaults: Dict[str, Any], at: str,
            allow_stream: bool) -> GenerateRequest:
    for key in ("model", "user"):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise fail(at, key, f"expected a string, got {body[key]!r}")
    for key, neutral in NEUTRAL_FIELDS.items():
        if key in body and not _neutral(body[key], neutral):
            raise fail(at, key, f"{body[key]!r}; allowed: {neutral[0]!r} only (the engine does not apply it)")
    request = GenerateRequest(kind, _sampling(body, at), body.get("model"))
    if body.get("n") is not None:
        request.n = _integer(at, "n", body["n"])
        if not 1 <= request.n <= MAX_N:
            raise fail(at, "n", f"{request.n}; allowed: 1 to {MAX_N}")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise fail(at, "stream", f"expected true or false, got {stream!r}")
    if stream and not allow_stream:
        raise fail(at, "stream", f"{stream!r}; batch requests cannot stream (use false)")
    request.stream = bool(stream)
    options = body.get("stream_options")
    if options is not None:
        if not request.stream:
            raise fail(at, "stream_options", "only allowed with stream: true")
        if not isinstance(options, dict):
            raise fail(at, "stream_options", f"expected an object, got {options!r}")
        where = path(at, "stream_options")
        _known(options, ("include_usage", "continuous_usage_stats"), where)
        for key in options:
            if options[key] is not None and not isinstance(options[key], bool):
                raise fail(where, key, f"expected true or false, got {options[key]!r}")
        request.include_usage = bool(options.get("include_usage"))
        request.continuous_usage = bool(options.get("continuous_usage_stats"))
    try:
        SamplingParams(**{**defaults, **request.sampling})
    except (TypeError, ValueError) as e:
        key = str(e).split()[0]
        raise InputError(f"{at + ': ' if at else ''}{e}", param=path(at, key).split(": ")[-1]) from None
    return request


def _sampling(body: Dict[str, Any], at: str) -> Dict[str, Any]:
    sampling: Dict[str, Any] = {}
    for key, target in SAMPLING_FIELDS.items():
        if body.get(key) is None:
            continue
        value = body[key]
        if key in FLOAT_FIELDS:
            value = _number(at, key, value)
        elif key in INT_FIELDS:
            value = _integer(at, key, value)
        elif key == "ignore_eos":
            if not isinstance(value, bool):
                raise fail(at, key, f"expected true or false, got {value!r}")
        elif key == "stop":
            if not (isinstance(value, str) or (isinstance(value, list) and all(isinstance(s, str) for s in value))):
                raise fail(at, key, f"expected a string or a list of strings, got {value!r}")
        elif key == "stop_token_ids":
            if not isinstance(value, list) or not all(_is_int(t) and t >= 0 for t in value):
                raise fail(at, key, f"expected a list of token ids (integers >= 0), got {value!r}")
        sampling[target] = value
    seed = sampling.get("seed")
    if seed is not None and not -2 ** 63 <= seed < 2 ** 63:
        raise fail(at, "seed", f"{seed}; allowed: a 64-bit signed integer")
    if body.get("logit_bias") is not None:
        sampling["logit_bias"] = _logit_bias(body["logit_bias"], at)
    structured = _structured(body, at)
    if structured is not None:
        sampling["structured"] = structured
    return sampling


def _logit_bias(value: Any, at: str) -> Dict[int, float]:
    """OpenAI's {"token id": bias}: ids as decimal strings (JSON keys), biases in [-100, 100]."""
    if not isinstance(value, dict):
        raise fail(at, "logit_bias", f"expected an object of token id -> bias, got {value!r:.80}")
    bias = {}
    for key, number in value.items():
        where = path(at, "logit_bias")
        if not (isinstance(key, str) and key.isdigit()) and not _is_int(key):
            raise fail(where, key, "expected a token id (a non-negative integer) as the key")
        bias[int(key)] = _number(where, key, number)
    return bias


def _structured(body: Dict[str, Any], at: str) -> Optional[StructuredOutput]:
    """OpenAI's `response_format` or vLLM's `structured_outputs` as one StructuredOutput (None: free text);
    a grammar that cannot compile is refused here, naming the field."""
    format_, extra = body.get("response_format"), body.get("structured_outputs")
    if format_ is not None and extra is not None:
        raise fail(at, "structured_outputs", "give response_format or structured_outputs, not both")
    if format_ is not None:
        structured, key = _response_format(format_, path(at, "response_format")), "response_format"
    elif extra is not None:
        structured, key = _structured_outputs(extra, path(at, "structured_outputs")), "structured_outputs"
    else:
        return None
    if structured is not None:
        try:
            structured.check()
        except ValueError as e:
            raise fail(at, key, str(e)) from None
    return structured


def _response_format(value: Any, at: str) -> Optional[StructuredOutput]:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return json_object()
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise fail(at, "json_schema", "required, an object {name, schema, strict} whose schema is a JSON "
                                          "schema object")
        return StructuredOutput("json", json.dumps(spec["schema"]))
    raise fail(at, "type", f"{kind!r}; allowed: text, json_object, json_schema")


def _structured_outputs(value: Any, at: str) -> StructuredOutput:
    if not isinstance(value, dict):
        raise InputError(f"{at}: expected an object with one of {', '.join(STRUCTURED_KINDS)}", param=at)
    given = [k for k in STRUCTURED_KINDS if value.get(k) is not None]
    if len(given) != 1:
        raise InputError(f"{at}: give exactly one of {', '.join(STRUCTURED_KINDS)} (got "
                         f"{', '.join(given) or 'none'})", param=at)
    kind, spec = given[0], value[given[0]]
    if kind == "json":
        if isinstance(spec, str):
            return StructuredOutput("json", spec)
        if isinstance(spec, dict):
            return StructuredOutput("json", json.dumps(spec))
        raise fail(at, kind, "expected a JSON schema (an object, or its JSON text)")
    if kind == "choice":
        if not isinstance(spec, list) or not spec or not all(isinstance(c, str) for c in spec):
            raise fail(at, kind, "expected a non-empty list of strings")
        return StructuredOutput("choice", json.dumps(spec))
    if not isinstance(spec, str) or not spec:
        raise fail(at, kind, "expected a non-empty string")
    return StructuredOutput(kind, spec)


def _with_logprobs(request: GenerateRequest) -> GenerateRequest:
    if request.top_logprobs is not None:
        request.sampling["logprobs"] = request.top_logprobs
    return request


def _prompts(prompt: Any, at: str) -> List[Union[str, List[int]]]:
    """`prompt`: one text, one token-id list, or a non-empty list of either -> the list of prompts."""
    if prompt is None:
        raise fail(at, "prompt", "required, a string, a list of token ids, or a list of those")
    one = isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt))
    prompts = [prompt] if one else prompt
    if not isinstance(prompts, list) or not prompts:
        raise fail(at, "prompt", f"expected a string, a list of token ids, or a non-empty list of those, "
                                 f"got {prompt!r:.80}")
    return [_prompt(p, at) for p in prompts]


def _prompt(prompt: Any, at: str) -> Union[str, List[int]]:
    if isinstance(prompt, str):
        if not prompt:
            raise fail(at, "prompt", "empty; give some text or token ids")
        return prompt
    if isinstance(prompt, list) and prompt and all(_is_int(t) and t >= 0 for t in prompt):
        return list(prompt)
    raise fail(at, "prompt", f"expected a string or a non-empty list of token ids (integers >= 0), got {prompt!r:.80}")


def _neutral(value: Any, allowed) -> bool:
    """`value` is one of `allowed`, where true is not 1 and false is not 0 (as in JSON)."""
    if isinstance(value, bool):
        return any(value is a for a in allowed)
    return any(value == a and not isinstance(a, bool) for a in allowed)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(at: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise fail(at, key, f"expected a number, got {value!r}")
    return float(value)


def _integer(at: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not float(value).is_integer():
        raise fail(at, key, f"expected an integer, got {value!r}")
    return int(value)

