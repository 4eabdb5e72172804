"""`chat_requests`: the run record -> one record per chat request, every request validated first.

Inputs (`appliance run pipeline=llava_chat ...`):
  - `input=photo.png prompt="..."`: one request, a user message with the image and the text (the image
    may also be an http(s) or data: URL);
  - `prompt="..."` alone: one text-only request;
  - `input=requests.jsonl output=answers.jsonl`: one request per line in the OpenAI batch format
    `{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body": {"messages", ...}}`.
Local image paths are allowed only inside `server.allowed_local_media_dir`, or, when that is unset, inside
the input file's directory. Every line is parsed and checked before the first record leaves this stage,
so a bad line 900 fails the run before any model loads; errors name the line and the field.
"""
import json
import os
import tempfile
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

from appliance.engine.sampling_params import SamplingParams
from appliance.errors import InputError
from appliance.pipeline import Record, Stage, register_stage
from appliance.vision.image_load import is_remote_image

BATCH_URL = "/v1/chat/completions"
ROLES = ("system", "user", "assistant")
# body field -> SamplingParams field (top_k is an extension, as in vLLM)
SAMPLING_FIELDS = {"max_tokens": "max_tokens", "max_completion_tokens": "max_tokens", "temperature": "temperature",
                   "top_p": "top_p", "top_k": "top_k", "seed": "seed", "stop": "stop"}
OTHER_FIELDS = ("messages", "model", "n", "stream", "user")
NUMBER_FIELDS = {"temperature": float, "top_p": float, "max_tokens": int, "max_completion_tokens": int,
                 "top_k": int, "seed": int}


@dataclass
class ChatRequest:
    custom_id: str
    messages: List[Dict[str, Any]]  # OpenAI messages, validated (content: str or list of parts)
    sampling: Dict[str, Any]        # SamplingParams fields the request sets
    model: Optional[str] = None     # body.model, echoed in the response
    line: Optional[int] = None      # 1-based line of the batch file, None for a single prompt

    def where(self, source: str) -> str:
        """How errors name this request: `requests.jsonl line 3 (custom_id 'a')` or `input`."""
        if self.line is None:
            return "input"
        return f"{os.path.basename(source)} line {self.line} (custom_id {self.custom_id!r})"


# ---- one line ------------------------------------------------------------------------------------

def parse_batch_line(text: str, line: int) -> ChatRequest:
    """One line of an OpenAI batch input file -> ChatRequest; InputError naming the line and field."""
    at = f"line {line}"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{at}: not valid JSON ({e.msg} at column {e.colno}); each line is one request "
                         '{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body": {...}}') from None
    if not isinstance(obj, dict):
        raise InputError(f"{at}: expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - {"custom_id", "method", "url", "body"})
    if unknown:
        raise InputError(f"{at}: {unknown[0]}: unknown field; allowed: custom_id, method, url, body")
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise InputError(f"{at}: custom_id: required, a non-empty string")
    if obj.get("method", "POST") != "POST":
        raise InputError(f"{at}: method: {obj.get('method')!r}; allowed: POST")
    if obj.get("url", BATCH_URL) != BATCH_URL:
        raise InputError(f"{at}: url: {obj.get('url')!r}; allowed: {BATCH_URL}")
    body = obj.get("body")
    if not isinstance(body, dict):
        raise InputError(f"{at}: body: required, an object with messages (a chat completion request)")
    model, sampling = parse_body(body, f"{at}: body")
    return ChatRequest(custom_id, check_messages(body.get("messages"), f"{at}: body.messages"), sampling,
                       model, line)


def parse_body(body: Dict[str, Any], at: str) -> Tuple[Optional[str], Dict[str, Any]]:
    """(model, sampling) of a chat completion request body; checks every field but messages."""
    allowed = sorted({*SAMPLING_FIELDS, *OTHER_FIELDS})
    for key in body:
        if key not in SAMPLING_FIELDS and key not in OTHER_FIELDS:
            raise InputError(f"{at}.{key}: unknown or unsupported field; allowed: {', '.join(allowed)}")
    if "messages" not in body:
        raise InputError(f"{at}.messages: required, a list of {{role, content}} messages")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise InputError(f"{at}.model: expected a string, got {model!r}")
    if body.get("n", 1) != 1:
        raise InputError(f"{at}.n: {body['n']!r}; only n=1 is supported")
    if body.get("stream", False) is not False:
        raise InputError(f"{at}.stream: {body['stream']!r}; batch requests cannot stream (use false)")
    sampling: Dict[str, Any] = {}
    for key, target in SAMPLING_FIELDS.items():
        if key not in body or body[key] is None:
            continue
        value = body[key]
        kind = NUMBER_FIELDS.get(key)
        if kind is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                 or (kind is int and not float(value).is_integer())):
            raise InputError(f"{at}.{key}: expected {'an integer' if kind is int else 'a number'}, got {value!r}")
        if key == "stop" and not (isinstance(value, str) or (isinstance(value, list)
                                                            and all(isinstance(s, str) for s in value))):
            raise InputError(f"{at}.stop: expected a string or a list of strings, got {value!r}")
        sampling[target] = kind(value) if kind is not None else value
    try:
        SamplingParams(**sampling)
    except ValueError as e:
        raise InputError(f"{at}: {e}") from None
    return model, sampling


def check_messages(messages: Any, at: str) -> List[Dict[str, Any]]:
    """OpenAI chat messages: roles system/user/assistant; content a string or text / image_url parts."""
    if not isinstance(messages, list) or not messages:
        raise InputError(f"{at}: required, a non-empty list of {{role, content}} messages")
    for i, message in enumerate(messages):
        where = f"{at}[{i}]"
        if not isinstance(message, dict):
            raise InputError(f"{where}: expected an object {{role, content}}, got {type(message).__name__}")
        if message.get("role") not in ROLES:
            raise InputError(f"{where}.role: {message.get('role')!r}; allowed: {', '.join(ROLES)}")
        extra = sorted(set(message) - {"role", "content", "name"})
        if extra:
            raise InputError(f"{where}.{extra[0]}: unknown field; allowed: role, content, name")
        content = message.get("content")
        if isinstance(content, str):
            continue
        if not isinstance(content, list) or not content:
            raise InputError(f"{where}.content: expected a string or a non-empty list of parts")
        for j, part in enumerate(content):
            check_part(part, f"{where}.content[{j}]")
    return messages


def check_part(part: Any, at: str) -> None:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise InputError(f"{at}.text: required, a string")
    elif kind == "image_url":
        url = image_url(part)
        if not isinstance(url, str) or not url:
            raise InputError(f"{at}.image_url.url: required, a data:image/...;base64 URL, an http(s) URL or a "
                             "path inside the allowed media directory")
    else:
        raise InputError(f"{at}.type: {kind!r}; allowed: text, image_url")


def image_url(part: Dict[str, Any]) -> Any:
    """The URL of an image_url part: `{"image_url": {"url": ...}}` (or the bare string some clients send)."""
    value = part.get("image_url")
    return value.get("url") if isinstance(value, dict) else value


# ---- the whole run -------------------------------------------------------------------------------

def read_batch_file(path: str) -> List[ChatRequest]:
    """Every line of a batch file, parsed and checked; duplicate custom_ids and empty files refused."""
    requests: List[ChatRequest] = []
    seen: Dict[str, int] = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line, text in enumerate(f, 1):
                if not text.strip():
                    continue
                request = parse_batch_line(text, line)
                if request.custom_id in seen:
                    raise InputError(f"line {line}: custom_id {request.custom_id!r} repeats line "
                                     f"{seen[request.custom_id]}; each request needs its own")
                seen[request.custom_id] = line
                requests.append(request)
    except UnicodeDecodeError:
        raise InputError(f"input: {path} is not UTF-8 text; a batch file is JSON lines") from None
    except OSError as e:
        raise InputError(f"input: cannot read {path} ({e.strerror or e})") from None
    if not requests:
        raise InputError(f"input: {path} holds no requests; write one JSON request per line")
    return requests


def single_request(image: Optional[str], prompt: Optional[str]) -> ChatRequest:
    if not isinstance(prompt, str) or not prompt.strip():
        raise InputError('prompt: required with an image input; pass prompt="What is in the image?"')
    parts: List[Dict[str, Any]] = []
    if image is not None:
        url = image if is_remote_image(image) else os.path.basename(image)  # a file: under its media dir
        parts.append({"type": "image_url", "image_url": {"url": url}})
    parts.append({"type": "text", "text": prompt})
    return ChatRequest("prompt", [{"role": "user", "content": parts}], {})


def check_batch_output(source: str, output: Any) -> str:
    """The output path for a batch run: required, not the input, not existing, in a writable directory."""
    if output is None or str(output) == "":
        raise InputError("output: required with a .jsonl input; pass output=answers.jsonl")
    output = str(output)
    if os.path.realpath(output) == os.path.realpath(source):
        raise InputError(f"output: {output} is the input file; choose another output path")
    if os.path.isdir(output):
        raise InputError(f"output: {output} is a directory; expected a file path such as answers.jsonl")
    if os.path.lexists(output):
        raise InputError(f"output: {output} exists; remove it or choose another name")
    directory = os.path.dirname(os.path.abspath(output))
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".appliance-probe-"):
            pass
    except OSError as e:
        raise InputError(f"output: cannot write to directory {directory} ({e.strerror or e})") from None
    return output


def plan_run(record: Record, media_dir: Optional[str]) -> Tuple[List[ChatRequest], Optional[str], Optional[str], str]:
    """(requests, output path or None, allowed media directory, source name) for one run record."""
    source, output, prompt = record.get("input"), record.get("output"), record.get("prompt")
    if source is not None and not isinstance(source, str):
        raise InputError(f"input: expected one path (an image or a .jsonl batch file), got {source!r}")
    if source is None or source == "":
        if output not in (None, ""):
            raise InputError("output: only used with a .jsonl input; a single prompt prints its answer")
        return [single_request(None, prompt)], None, media_dir, "prompt"
    if is_remote_image(source):  # loaded (with its size limits) by chat_prompt, like an image_url part
        if output not in (None, ""):
            raise InputError("output: only used with a .jsonl input; a single prompt prints its answer")
        return [single_request(source, prompt)], None, media_dir, "input"
    if not os.path.isfile(source):
        raise InputError(f"input: {source} is not a file; pass an image or a .jsonl batch file")
    allowed = media_dir or os.path.dirname(os.path.abspath(source))
    if source.lower().endswith(".jsonl"):
        if prompt not in (None, ""):
            raise InputError("prompt: not used with a .jsonl input; each request carries its own messages")
        return read_batch_file(source), check_batch_output(source, output), allowed, source
    if output not in (None, ""):
        raise InputError("output: only used with a .jsonl input; a single prompt prints its answer")
    real = os.path.realpath(source)  # the file named on the command line is allowed, wherever a link points
    return [single_request(real, prompt)], None, os.path.dirname(real), source


@register_stage
class ChatRequests(Stage):
    """One record per request: messages, sampling, custom_id, model_name, where (how errors name it),
    media_dir (local paths allowed under it), output_path (batch only), request_index, request_count."""

    name = "chat_requests"
    consumes = ("input", "output", "prompt")
    produces = ("messages", "sampling", "custom_id", "model_name", "where", "media_dir", "output_path",
                "request_index", "request_count")

    def process(self, records: Iterator[Record]) -> Iterator[Record]:
        for record in records:
            requests, output, allowed, source = plan_run(record, self.cfg.server.allowed_local_media_dir)
            for index, request in enumerate(requests):
                yield {"messages": request.messages, "sampling": request.sampling, "custom_id": request.custom_id,
                       "model_name": request.model, "where": request.where(source), "media_dir": allowed,
                       "output_path": output, "request_index": index, "request_count": len(requests)}
