"""`chat_requests`: the run record -> one record per chat request, every request validated first.

Inputs (`appliance run pipeline=llava_chat ...`):
  - `input=photo.png prompt="..."`: one request, a user message with the image and the text (the image
    may also be an http(s) or data: URL); `prompt_file=PATH` instead of `prompt=`, and `system="..."` for a
    system message first (run_question.py);
  - `prompt="..."` alone: one text-only request;
  - `input=requests.jsonl output=answers.jsonl`: one request per line in the OpenAI batch format
    `{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body": {"messages", ...}}`, or
    `"url": "/v1/completions"` with `"body": {"prompt", ...}` (a text or token ids, or a list of them);
    a file may mix both; `overwrite=true` replaces an existing output file. A body is parsed as the
    server parses it (appliance/protocol/openai_requests.py).
A completion request gives one record per prompt (`completion_prompt`: the prompt as sent; no messages),
`chat_prompt` turns it into token ids as the server does, and `chat_responses` answers the request's
records as one `text_completion`.
Local image paths are allowed only inside `server.allowed_local_media_dir`, or, when that is unset, inside
the input file's directory. Every line is parsed and checked before the first record leaves this stage,
so a bad line 900 fails the run before any model loads; errors name the line and the field.
"""
import json
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from appliance.errors import InputError
from appliance.output_files import check_writable_dir
from appliance.pipeline import Record, Stage, register_stage
from appliance.protocol.openai_requests import CHAT_ANSWER_SAMPLING, parse_chat, parse_completion
from appliance.stages.chat.run_question import question_keys, run_prompt, system_message
from appliance.stages.engine_stage import sampling_defaults
from appliance.vision.image_load import is_remote_image

CHAT_URL, COMPLETION_URL = "/v1/chat/completions", "/v1/completions"
PARSERS = {CHAT_URL: parse_chat, COMPLETION_URL: parse_completion}  # a batch line's url -> its body's parser


@dataclass
class ChatRequest:
    custom_id: str
    messages: Optional[List[Dict[str, Any]]]  # chat: OpenAI messages, validated (content: str or list of parts)
    sampling: Dict[str, Any]        # SamplingParams fields the request sets
    model: Optional[str] = None     # body.model, echoed in the response
    line: Optional[int] = None      # 1-based line of the batch file, None for a single prompt
    top_logprobs: Optional[int] = None  # logprobs asked for: the sampled token's plus the top N
    n: int = 1                      # answers asked for (per prompt)
    prompts: Optional[List[Union[str, List[int]]]] = None  # completion: its prompts, texts or token ids
    echo: bool = False              # completion: each answer starts with its prompt
    # A single prompt's fields as the person set them (`input=photo.png`), by their protocol names
    # (`messages[0].content[0].image_url`): errors name what was typed, not the request it became.
    typed: Optional[Dict[str, str]] = None

    def where(self, source: str) -> str:
        """How errors name this request: `requests.jsonl line 3 (custom_id 'a')` or `input`."""
        if self.line is None:
            return "input"
        return f"{os.path.basename(source)} line {self.line} (custom_id {self.custom_id!r})"


# ---- one line ------------------------------------------------------------------------------------

def parse_batch_line(text: str, line: int, defaults: Optional[Dict[str, Any]] = None) -> ChatRequest:
    """One line of an OpenAI batch input file -> ChatRequest; InputError naming the line and field.
    `defaults`: the pipeline's sampling defaults (the engine stage's `sampling`)."""
    at = f"line {line}"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{at}: not valid JSON ({e.msg} at column {e.colno}); each line is one request "
                         '{"custom_id", "method": "POST", "url": "/v1/chat/completions" or "/v1/completions", '
                         '"body": {...}}') from None
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
    url = obj.get("url", CHAT_URL)
    if url not in PARSERS:
        raise InputError(f"{at}: url: {url!r}; allowed: {', '.join(PARSERS)}")
    body = obj.get("body")
    if not isinstance(body, dict):
        what = "messages (a chat completion request)" if url == CHAT_URL else "prompt (a completion request)"
        raise InputError(f"{at}: body: required, an object with {what}")
    request = PARSERS[url](body, defaults, at=f"{at}: body", allow_stream=False)
    return ChatRequest(custom_id, request.messages, request.sampling, request.model, line, request.top_logprobs,
                       request.n, request.prompts if url == COMPLETION_URL else None, request.echo)


# ---- the whole run -------------------------------------------------------------------------------

def read_batch_file(path: str, defaults: Optional[Dict[str, Any]] = None) -> List[ChatRequest]:
    """Every line of a batch file, parsed and checked; duplicate custom_ids and empty files refused."""
    requests: List[ChatRequest] = []
    seen: Dict[str, int] = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line, text in enumerate(f, 1):
                if not text.strip():
                    continue
                request = parse_batch_line(text, line, defaults)
                if request.custom_id in seen:
                    raise InputError(f"line {line}: custom_id {request.custom_id!r} repeats line "
                                     f"{seen[request.custom_id]}; each request needs its own")
                seen[request.custom_id] = line
                requests.append(request)
    except UnicodeDecodeError:
        raise InputError(f"input: {path} is not UTF-8 text; a batch file is JSON lines", param="input") from None
    except OSError as e:
        raise InputError(f"input: cannot read {path} ({e.strerror or e})", param="input") from None
    if not requests:
        raise InputError(f"input: {path} holds no requests; write one JSON request per line", param="input")
    return requests


def single_request(image: Optional[str], record: Record) -> ChatRequest:
    """One user message: the image (if any), then the question; after `system=`'s message when given."""
    prompt = run_prompt(record, image is not None)
    system = system_message(record)
    messages = [system] if system else []
    parts: List[Dict[str, Any]] = []
    typed: Dict[str, str] = {}
    if image is not None:
        url = image if is_remote_image(image) else os.path.basename(image)  # a file: under its media dir
        typed[f"messages[{len(messages)}].content[{len(parts)}].image_url"] = f"input={record['input']}"
        parts.append({"type": "image_url", "image_url": {"url": url}})
    parts.append({"type": "text", "text": prompt})
    return ChatRequest("prompt", [*messages, {"role": "user", "content": parts}], dict(CHAT_ANSWER_SAMPLING),
                       typed=typed)


def check_batch_output(source: str, output: Any, overwrite: bool = False) -> str:
    """The output path for a batch run: required, not the input, not existing unless `overwrite` (the
    answers then replace it whole, once all are written: `write_atomic`), in a writable directory."""
    if output is None or str(output) == "":
        raise InputError("output: required with a .jsonl input; pass output=answers.jsonl", param="output")
    output = str(output)
    if os.path.realpath(output) == os.path.realpath(source):
        raise InputError(f"output: {output} is the input file; choose another output path", param="output")
    if os.path.isdir(output):
        raise InputError(f"output: {output} is a directory; expected a file path such as answers.jsonl", param="output")
    if os.path.lexists(output) and not overwrite:
        raise InputError(f"output: {output} exists; pass overwrite=true to replace it, or choose another name",
                         param="output")
    check_writable_dir(os.path.dirname(os.path.abspath(output)))
    return output


def plan_run(record: Record, media_dir: Optional[str], defaults: Optional[Dict[str, Any]] = None
             ) -> Tuple[List[ChatRequest], Optional[str], Optional[str], str]:
    """(requests, output path or None, allowed media directory, source name) for one run record."""
    source, output = record.get("input"), record.get("output")
    if source is not None and not isinstance(source, str):
        raise InputError(f"input: expected one path (an image or a .jsonl batch file), got {source!r}", param="input")
    if source is None or source == "":
        _no_output(output)
        return [single_request(None, record)], None, media_dir, "prompt"
    if is_remote_image(source):  # loaded (with its size limits) by chat_prompt, like an image_url part
        _no_output(output)
        return [single_request(source, record)], None, media_dir, "input"
    if not os.path.isfile(source):
        raise InputError(f"input: {source} is not a file; pass an image or a .jsonl batch file", param="input")
    allowed = media_dir or os.path.dirname(os.path.abspath(source))
    if source.lower().endswith(".jsonl"):
        stray = question_keys(record)
        if stray:
            raise InputError(f"{stray[0]}: not used with a .jsonl input; each request carries its own messages",
                             param=stray[0])
        output = check_batch_output(source, output, bool(record.get("overwrite")))
        return read_batch_file(source, defaults), output, allowed, source
    _no_output(output)
    real = os.path.realpath(source)  # the file named on the command line is allowed, wherever a link points
    return [single_request(real, record)], None, os.path.dirname(real), source


def _no_output(output: Any) -> None:
    if output not in (None, ""):
        raise InputError("output: only used with a .jsonl input; a single prompt prints its answer", param="output")


@register_stage
class ChatRequests(Stage):
    """One record per chat request, one per prompt of a completion request: messages (None for a
    completion), completion_prompt (the prompt as sent; None for a chat), echo, prompt_number,
    prompt_count (the request's prompts: 1 for a chat), sampling, top_logprobs, n, custom_id, model_name,
    where (how errors name it), typed_fields (a single prompt's fields as typed), media_dir (local paths
    allowed under it), output_path (batch only),
    request_index, request_count.

    Offline only: the server takes requests from HTTP bodies (appliance/serving) instead."""

    name = "chat_requests"
    consumes = ("input", "output", "prompt", "prompt_file", "system", "overwrite")
    produces = ("messages", "completion_prompt", "echo", "prompt_number", "prompt_count", "sampling",
                "top_logprobs", "n", "custom_id", "model_name", "where", "typed_fields", "media_dir",
                "output_path", "request_index", "request_count")
    online = False

    def process(self, records: Iterator[Record]) -> Iterator[Record]:
        for record in records:
            requests, output, allowed, source = plan_run(record, self.cfg.server.allowed_local_media_dir,
                                                         sampling_defaults(self.cfg))
            for index, request in enumerate(requests):
                common = {"messages": request.messages, "echo": request.echo, "sampling": request.sampling,
                          "top_logprobs": request.top_logprobs, "n": request.n, "custom_id": request.custom_id,
                          "model_name": request.model, "where": request.where(source),
                          "typed_fields": request.typed, "media_dir": allowed,
                          "output_path": output, "request_index": index, "request_count": len(requests)}
                prompts = request.prompts if request.prompts is not None else [None]
                for number, prompt in enumerate(prompts):
                    yield {**common, "completion_prompt": prompt, "prompt_number": number,
                           "prompt_count": len(prompts)}

    def preflight(self, records: List[Record]) -> List[Record]:
        return list(self.process(iter(records)))  # local files only: a remote image is chat_prompt's to fetch
