"""`POST /v1/chat/completions` and `POST /v1/completions`, streaming (SSE) or not.

The body is parsed by the same code as the offline batch verb (appliance/protocol); preparation
(template, images, tokenizing) and every check that needs the model happen in the engine process, so
the route waits for the request's first event: `Admitted` (then it answers 200 and streams, or collects
the answer) or `Failed` (then it answers the error's status, before any byte of a stream). An error
after a stream started goes out as a `data: {"error": ...}` event, then the stream ends.

A request with several choices (`n`, or a list of prompts) gets one `Tokens` event per choice and step
(streaming: one chunk each, carrying its choice's `index`) or one per choice at its end (collected into
one answer); the request's last event is `final`.
"""
import dataclasses
import time
from typing import Any, AsyncIterator, Dict, List, Optional

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from appliance.protocol import openai_responses as shape
from appliance.protocol.openai_requests import GenerateRequest, parse_chat, parse_completion
from appliance.protocol.tool_answers import ToolCallAnswer
from appliance.serving.http.errors import APIError, error_response, parse_body
from appliance.serving.http.frontend import Channel, ClientGone, Frontend
from appliance.serving.messages import Failed, GenerateJob, Tokens


SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
NO_PARSER = ('"auto" reads tool calls out of free text and this model has no tool-call parser: serve it with '
             'model.tool_call_parser=hermes if it writes <tool_call> blocks, or send tool_choice "required", "none" '
             'or {"type": "function", "function": {"name": ...}} (tools without tool_choice mean "auto")')


class GenerateRoutes:
    def __init__(self, frontend: Frontend, cfg, sampling: dict):
        """`sampling`: the engine stage's, what a request's own sampling fields override."""
        self.frontend = frontend
        self.defaults = sampling
        self.media_dir = cfg.server.allowed_local_media_dir
        parser = cfg.model.tool_call_parser  # reads tool_choice "auto" answers
        # its name, as the ToolCalling message carries it to the engine process
        self.tool_parser: Optional[str] = parser.value if parser is not None else None

    async def chat(self, request: Request):
        return await self._handle(request, "chat")

    async def completions(self, request: Request):
        return await self._handle(request, "completion")

    async def _handle(self, request: Request, kind: str):
        parse = parse_chat if kind == "chat" else parse_completion
        uid = shape.new_id("chatcmpl" if kind == "chat" else "cmpl")
        request.state.request_id = uid  # the request log's id, a refused body's too (access_log.py)
        parsed = await parse_body(request, lambda body: parse(body, self.defaults))
        check_model(parsed.model, self.frontend.model_name)
        parsed.tool_calling = self._with_parser(parsed.tool_calling)
        channel = self.frontend.open(uid, request)
        streaming = False
        try:
            self.frontend.submit(channel, GenerateJob(parsed, self.media_dir))
            first = await self.frontend.next_event(channel)
            if isinstance(first, Failed):
                return error_response(first.status, first.message, first.param)
            request.state.prompt_tokens = first.prompt_tokens
            answer = AnswerShaper(uid, kind, parsed, self.frontend.model_name)
            if parsed.stream:
                streaming = True
                return EventStreamResponse(self._stream(answer, channel, request.state), headers=SSE_HEADERS,
                                           media_type="text/event-stream")
            return await self._collect(answer, channel, request.state)
        except ClientGone:
            return JSONResponse({}, status_code=499)  # nobody reads it; the request was aborted
        finally:
            if not streaming:
                self.frontend.close(channel)

    def _with_parser(self, calling):
        """An `auto` tool choice is read by the model's tool-call parser, and refused without one."""
        if calling is None or calling.mode != "auto":
            return calling
        if self.tool_parser is None:
            raise APIError(400, f"tool_choice: {NO_PARSER}", param="tool_choice")
        return dataclasses.replace(calling, parser=self.tool_parser)

    async def _collect(self, answer: "AnswerShaper", channel: Channel, state) -> JSONResponse:
        """`state`: the request's (request.state), where the request log finds the token counts."""
        choices: List[Tokens] = []
        while True:
            event = await self.frontend.next_event(channel)
            if isinstance(event, Failed):
                return error_response(event.status, event.message, event.param)
            if isinstance(event, Tokens):
                choices.append(event)
                if event.final:
                    state.completion_tokens = event.completion_tokens
                    return JSONResponse(answer.whole(choices))

    async def _stream(self, answer: "AnswerShaper", channel: Channel, state) -> AsyncIterator[bytes]:
        """The SSE body, one write per wake-up: a chat's role chunk goes out with the first event (continuous
        usage needs its prompt count), and whatever events are already queued (the last tokens, the usage
        chunk, [DONE]) share the last write. `state`: as `_collect`'s; the tokens sent, however it ends."""
        pending: List[bytes] = []
        completion_tokens = 0
        try:
            while True:
                try:
                    event = await self.frontend.next_event(channel)
                except APIError as e:  # the deadline passed mid-stream
                    event = Failed(e.status, e.message)
                if not answer.opened:
                    pending.extend(sse(chunk) for chunk in answer.opening(event))
                if isinstance(event, Failed):
                    pending.append(sse(shape.error_body(event.status, event.message, event.param)))
                    break
                if isinstance(event, Tokens):
                    completion_tokens = event.completion_tokens
                    pending.extend(sse(chunk) for chunk in answer.chunks(event))
                    if event.final:
                        break
                if not channel.has_events():
                    yield b"".join(pending)
                    pending = []
            pending.append(b"data: [DONE]\n\n")
            yield b"".join(pending)
        except ClientGone:
            pass  # nobody reads it: end the body
        finally:
            state.completion_tokens = completion_tokens
            self.frontend.close(channel)


class EventStreamResponse(StreamingResponse):
    """A StreamingResponse that leaves watching for the client to the request's Channel. Starlette's, under
    an ASGI 2.3 server (uvicorn), starts a second watcher beside the stream (a task group of two tasks per
    request), CPU in the HTTP process for what the Channel already does (docs/serving.md). The Channel
    ends the stream when the client goes (the body iterator gets ClientGone).
    tests/serving/test_event_stream_response.py checks what this relies on in Starlette."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            await self.stream_response(send)
        except OSError:  # the connection broke under a write: nobody reads the rest
            pass


class AnswerShaper:
    """Shapes one request's events into OpenAI bodies and chunks."""

    def __init__(self, uid: str, kind: str, request: GenerateRequest, model: str):
        self.uid, self.kind, self.request, self.model = uid, kind, request, model
        self.created = int(time.time())
        self.choices = request.n * max(len(request.prompts), 1)  # a chat request has one prompt
        self.text_offsets = [0] * self.choices  # completions' logprobs count characters from each answer's start
        self.opened = False  # the role chunks went out
        # vLLM's rule: usage on every chunk only when the client asked for usage at all.
        self.continuous_usage = request.include_usage and request.continuous_usage
        # A tool-calling chat: each choice's text read into tool calls, its logprobs held for its next chunk.
        self.tool_answers = [ToolCallAnswer(request.tool_calling) for _ in range(self.choices)] \
            if kind == "chat" and request.tool_calling is not None else None
        self.held_logprobs: List[list] = [[] for _ in range(self.choices)]

    def whole(self, events: List[Tokens]) -> Dict[str, Any]:
        """The answer from each choice's one event (the last event's counts are the request's)."""
        usage = shape.usage(events[-1].prompt_tokens, events[-1].completion_tokens)
        choices = [self._choice(e) for e in events]
        if self.kind == "chat":
            return shape.chat_completion(self.uid, self.model, self.created, choices, usage)
        return shape.text_completion(self.uid, self.model, self.created, choices, usage)

    def _choice(self, event: Tokens) -> shape.Choice:
        if self.tool_answers is None:
            return shape.Choice(event.index, event.text, event.finish_reason, event.logprobs)
        content, calls, reason = self.tool_answers[event.index].whole(event.text, event.finish_reason)
        return shape.Choice(event.index, content or "", reason, event.logprobs, calls)

    def opening(self, first_event) -> List[Dict[str, Any]]:
        """As vLLM's streams open: a chat's role chunk per choice (with continuous usage, the prompt's count
        and no completion tokens yet); none for a completion, whose first chunk carries its first token."""
        self.opened = True
        if self.kind != "chat":
            return []
        usage: Any = None if self.request.include_usage else ...  # as chat_chunk's usage_: ... leaves it out
        if self.continuous_usage and isinstance(first_event, Tokens):
            usage = shape.usage(first_event.prompt_tokens, 0)
        return [shape.chat_chunk(self.uid, self.model, self.created, i, {"role": "assistant", "content": ""},
                                 usage_=usage) for i in range(self.choices)]

    def chunks(self, event: Tokens) -> List[Dict[str, Any]]:
        usage = shape.usage(event.prompt_tokens, event.completion_tokens)
        per_chunk = usage if self.continuous_usage else (None if self.request.include_usage else ...)
        if self.tool_answers is not None:
            chunks = self._tool_chunks(self.tool_answers[event.index], event, per_chunk)
            if event.final and self.request.include_usage:
                chunks.append(shape.usage_chunk(self.kind, self.uid, self.model, self.created, usage))
            return chunks
        if self.kind == "chat":
            chunk = shape.chat_chunk(self.uid, self.model, self.created, event.index, {"content": event.text},
                                     event.finish_reason, event.logprobs, usage_=per_chunk)
        else:
            chunk = shape.text_chunk(self.uid, self.model, self.created, event.index, event.text,
                                     event.finish_reason, event.logprobs, self.text_offsets[event.index],
                                     usage_=per_chunk)
            self.text_offsets[event.index] += len(event.text)
        chunks = [chunk] if event.text or event.finish_reason or event.logprobs else []
        if event.final and self.request.include_usage:
            chunks.append(shape.usage_chunk(self.kind, self.uid, self.model, self.created, usage))
        return chunks


    def _tool_chunks(self, answer: ToolCallAnswer, event: Tokens, usage: Any) -> List[Dict[str, Any]]:
        """A tool-calling choice's chunks for its next text: one per delta (content, a call's start, more
        arguments), its finish reason on the last (an empty delta when nothing is left), the event's
        logprobs on the first (held until a chunk goes out)."""
        held = self.held_logprobs[event.index]
        held.extend(event.logprobs or ())
        deltas = answer.deltas(event.text, last=event.finish_reason is not None)
        if event.finish_reason is not None and not deltas:
            deltas.append({})
        chunks = []
        for i, delta in enumerate(deltas):
            reason = answer.finish_reason(event.finish_reason) if i == len(deltas) - 1 else None
            logprobs = None if event.logprobs is None or i else list(held)
            chunks.append(shape.chat_chunk(self.uid, self.model, self.created, event.index, delta, reason,
                                           logprobs, usage_=usage))
        if chunks:
            held.clear()
        return chunks


def sse(payload: Dict[str, Any]) -> bytes:
    # orjson: a chunk's JSON in a tenth of json.dumps' time, and a stream sends one per token
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def check_model(requested, served: str) -> None:
    if requested is not None and requested != served:
        raise APIError(404, f"model: {requested!r} does not exist; this server serves {served!r} (GET /v1/models)",
                       param="model")
