"""OpenAI request bodies (chat completions, completions) -> a checked `GenerateRequest`.

The bodies are validated by their pydantic models (protocol/openai_models.py), which the server's OpenAPI
document also shows. The offline batch verb (`appliance run ... input=requests.jsonl`, each line's `body`)
and the server's `/v1/chat/completions` and `/v1/completions` share this. A request's problems are one
`InputError` naming every bad field, each message starting with the field's path (`temperature: expected a
number, got 'hot'`; in a batch file `line 3: body.temperature: ...`), `param` the first one's path. Rules
between fields (`top_logprobs` needs `logprobs`, a named tool among `tools`) are checked once every field is
valid on its own. Fields a request leaves out take the pipeline's defaults (the engine stage's `sampling`),
not OpenAI's.
"""
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Type, TypeVar, Union

from pydantic import ValidationError

from appliance.engine.sampling_params import SamplingError, SamplingParams, over_defaults
from appliance.errors import InputError
from appliance.protocol.openai_models import ChatCompletionRequest, CompletionRequest, GenerateBody
from appliance.protocol.openai_tools import ToolCalling
from appliance.protocol.validation import input_error, located

# body field -> SamplingParams field. top_k, min_tokens, ignore_eos, stop_token_ids extend OpenAI, as in vLLM.
SAMPLING_FIELDS = {"max_tokens": "max_tokens", "max_completion_tokens": "max_tokens", "temperature": "temperature",
                   "top_p": "top_p", "top_k": "top_k", "seed": "seed", "min_tokens": "min_tokens",
                   "ignore_eos": "ignore_eos", "stop": "stop", "stop_token_ids": "stop_token_ids"}
# A chat answer starts a new turn rather than continuing the prompt's text: its text is its ids decoded
# alone, as transformers' decode gives them (no space carried over from the prompt).
CHAT_ANSWER_SAMPLING = {"decode_after_prompt": False}
TOKEN_IDS = "a non-empty list of token ids (integers >= 0)"
# What an error says a field should be (by path, list indexes as []), where pydantic's words would not help.
EXPECTED = {
    "model": "a string (GET /v1/models names the served model)",
    "user": "a string",
    "messages": "a non-empty list of {role, content} messages",
    "messages[]": "an object {role, content}",
    "messages[].content": "a string or a non-empty list of parts",
    "messages[].tool_calls": 'a non-empty list of {id, type: "function", function: {name, arguments}}',
    "messages[].tool_calls[]": 'an object {id, type: "function", function: {name, arguments}}',
    "messages[].tool_calls[].function": "an object {name, arguments}",
    "messages[].tool_calls[].function.arguments": "the arguments as JSON text (a string)",
    "messages[].tool_call_id": "a non-empty string, the id of the tool call answered",
    "messages[].content[]": "a part {type: text | image_url, ...}",
    "messages[].content[].text": "a string",
    "messages[].content[].image_url": "an object {url}",
    "messages[].content[].image_url.url": "a data:image/...;base64 URL, an http(s) URL or a path inside the "
                                          "allowed media directory",
    "prompt": f"a non-empty string, {TOKEN_IDS}, or a non-empty list of such prompts",
    "stop": "a non-empty string or a list of them",
    "stop_token_ids": "a list of token ids (integers >= 0)",
    "logit_bias": "an object of token id -> bias",
    "logit_bias[key]": "a token id (a non-negative integer) as the key",
    "stream_options": "an object {include_usage, continuous_usage_stats}",
    "response_format": "an object {type, json_schema}",
    "response_format.json_schema": "an object {name, schema, strict} whose schema is a JSON schema object",
    "response_format.json_schema.schema": "a JSON schema object",
    "structured_outputs": "an object with one of json, regex, choice, grammar",
    "structured_outputs.json": "a JSON schema (an object, or its JSON text)",
    "structured_outputs.regex": "a non-empty string",
    "structured_outputs.grammar": "a non-empty string",
    "structured_outputs.choice": "a non-empty list of strings",
    "tools": 'a list of {type: "function", function: {name, description, parameters}}',
    "tools[]": 'an object {type: "function", function: {name, description, parameters}}',
    "tools[].function": "an object {name, description, parameters}",
    "tools[].function.name": "a non-empty string",
    "tools[].function.parameters": "a JSON schema object",
    "tool_choice": '"none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
    "tool_choice.function": "an object {name}",
    "tool_choice.function.name": "a non-empty string, the name of one of tools",
}
UNKNOWN = "unknown or unsupported field"
Body = TypeVar("Body", bound=GenerateBody)


@dataclass
class GenerateRequest:
    kind: str                                    # "chat" | "completion"
    sampling: Dict[str, Any]                     # SamplingParams fields the request sets
    model: Optional[str] = None                  # body.model, checked by the server, echoed in answers
    messages: Optional[List[Dict[str, Any]]] = None   # chat: validated OpenAI messages, as sent
    prompts: List[Union[str, List[int]]] = field(default_factory=list)  # completion: texts or token ids
    n: int = 1                                   # answers (choices) per prompt
    echo: bool = False                           # completion: the prompt before each answer
    stream: bool = False
    include_usage: bool = False                  # stream_options.include_usage: a last chunk with usage
    continuous_usage: bool = False               # stream_options.continuous_usage_stats: usage on every chunk
    top_logprobs: Optional[int] = field(default=None)  # None: no logprobs; N: sampled token's plus the top N
    tools: Optional[List[Dict[str, Any]]] = None  # chat: the tools as sent, rendered into the prompt
    tool_calling: Optional[ToolCalling] = None   # chat: tool calls the answer holds (None: text only)
    use_beam_search: bool = False                # the n answers to each prompt are a beam search's
    length_penalty: float = 1.0                  # beam search: the length's exponent in the ranking


def parse_chat(body: Any, defaults: Optional[Dict[str, Any]] = None, at: str = "",
               allow_stream: bool = True) -> GenerateRequest:
    """A chat completion request body; `defaults` are the pipeline's sampling defaults; `at` prefixes error
    paths (a batch file's `line 3: body`)."""
    parsed = _validate(ChatCompletionRequest, body, at)
    request = _common(parsed, "chat", defaults or {}, at, allow_stream)
    request.sampling.update(CHAT_ANSWER_SAMPLING)
    request.messages = body["messages"]  # as sent: keys a message may carry beyond role and content stay
    if parsed.tools is not None and not allow_stream:  # a batch file's answers hold text only
        raise located(at, "tools", "batch requests cannot call tools; send them to the server (appliance serve)")
    request.tools = [tool.model_dump(exclude_none=True) for tool in parsed.tools] if parsed.tools else None
    request.tool_calling = parsed.tool_calling()
    constraint = parsed.tool_constraint()
    if constraint is not None:
        request.sampling["structured"] = constraint
    if parsed.logprobs:
        request.top_logprobs = parsed.top_logprobs or 0
    return _with_logprobs(request)


def parse_completion(body: Any, defaults: Optional[Dict[str, Any]] = None, at: str = "",
                     allow_stream: bool = True) -> GenerateRequest:
    """A (legacy) completion request body: one prompt or several, as text or token ids."""
    parsed = _validate(CompletionRequest, body, at)
    request = _common(parsed, "completion", defaults or {}, at, allow_stream)
    request.prompts, request.echo = parsed.prompts(), bool(parsed.echo)
    request.top_logprobs = parsed.logprobs
    if request.echo and request.top_logprobs is not None:  # the prompt's tokens are answered with logprobs too
        request.sampling["prompt_logprobs"] = request.top_logprobs
    return _with_logprobs(request)


def image_url(part: Dict[str, Any]) -> Any:
    """The URL of an image_url part: `{"image_url": {"url": ...}}` (or the bare string some clients send)."""
    value = part.get("image_url")
    return value.get("url") if isinstance(value, dict) else value


def _validate(model: Type[Body], body: Any, at: str) -> Body:
    if not isinstance(body, dict):
        raise InputError(f"{at or 'body'}: expected a JSON object, got {type(body).__name__}", param=at or None)
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise input_error(e, model, EXPECTED, at, UNKNOWN) from None


def _common(parsed: GenerateBody, kind: str, defaults: Dict[str, Any], at: str,
            allow_stream: bool) -> GenerateRequest:
    if parsed.stream and not allow_stream:
        raise located(at, "stream", "True; batch requests cannot stream (use false)")
    if parsed.use_beam_search and not allow_stream:
        raise located(at, "use_beam_search", "True; batch requests cannot use beam search; send them to the "
                                             "server (appliance serve)")
    sampling = {target: getattr(parsed, name) for name, target in SAMPLING_FIELDS.items()
                if getattr(parsed, name) is not None}
    if parsed.logit_bias is not None:
        sampling["logit_bias"] = {int(token): bias for token, bias in parsed.logit_bias.items()}
    structured = parsed.structured()
    if structured is not None:
        sampling["structured"] = structured
    options = parsed.stream_options
    request = GenerateRequest(kind, sampling, parsed.model, n=parsed.n or 1, stream=bool(parsed.stream),
                              include_usage=bool(options and options.include_usage),
                              continuous_usage=bool(options and options.continuous_usage_stats),
                              use_beam_search=bool(parsed.use_beam_search), length_penalty=parsed.length_penalty)
    try:  # the ranges SamplingParams owns, and the request's fields together with the pipeline's defaults
        SamplingParams(**over_defaults(defaults, sampling))
    except SamplingError as e:
        raise InputError(f"{at + ': ' if at else ''}{e}", param=located(at, e.field, "").param) from None
    return request


def _with_logprobs(request: GenerateRequest) -> GenerateRequest:
    if request.top_logprobs is not None:
        request.sampling["logprobs"] = request.top_logprobs
    return request
