"""What `EventStreamResponse` (appliance/serving/http/routes_generate.py) relies on in Starlette is still
there (in-process, no server started). It replaces `StreamingResponse.__call__` so that the request's
Channel is the only reader of the client's `receive`: a Starlette release that gives `__call__` another
duty, or changes `stream_response`, fails here, not in production."""
import ast
import asyncio
import inspect
import json
import textwrap

import pytest
from omegaconf import OmegaConf
from starlette.requests import Request
from starlette.responses import StreamingResponse

from appliance.serving.http.frontend import Frontend
from appliance.serving.http.routes_generate import SSE_HEADERS, EventStreamResponse, GenerateRoutes
from appliance.serving.messages import Abort, Admitted, GenerateJob, Tokens
from appliance.serving.state import SharedState

SPEC_VERSIONS = ("2.3", "2.4")  # uvicorn's, and the version from which Starlette starts no watcher itself


def self_attributes(function) -> set:
    """The attributes of `self` that `function` reads or calls."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    return {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"}


def http_scope(spec_version: str) -> dict:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": spec_version}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
            "query_string": b"", "root_path": "", "headers": [(b"content-type", b"application/json")],
            "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000)}


async def no_receive():
    raise AssertionError("the response read the client's messages: only the request's Channel may")


async def chunks(*parts: bytes):
    for part in parts:
        yield part


def test_starlettes_call_streams_watches_and_runs_background_tasks_nothing_more():
    # Ours keeps `stream_response` and leaves out the rest: the disconnect watcher (`listen_for_disconnect`,
    # a second task per request under ASGI < 2.4; the Channel watches instead), the background task (our
    # streams have none) and the websocket denial (our routes are HTTP). A duty added here must be weighed
    # for ours; a watcher gone from here makes ours needless.
    assert self_attributes(StreamingResponse.__call__) == {
        "stream_response", "listen_for_disconnect", "background", "_wrap_websocket_denial_send"}
    assert "spec_version" in inspect.getsource(StreamingResponse.__call__)
    assert EventStreamResponse.__call__ is not StreamingResponse.__call__
    assert list(inspect.signature(StreamingResponse.stream_response).parameters) == ["self", "send"]
    assert EventStreamResponse(chunks(), headers=SSE_HEADERS, media_type="text/event-stream").background is None


@pytest.mark.parametrize("spec_version", SPEC_VERSIONS)
def test_stream_response_sends_the_start_each_chunk_and_the_end_without_reading_the_client(spec_version):
    sent = []

    async def send(message):
        sent.append(message)

    response = EventStreamResponse(chunks(b"data: 1\n\n", b"data: 2\n\n"), headers=SSE_HEADERS,
                                   media_type="text/event-stream")
    asyncio.run(response(http_scope(spec_version), no_receive, send))
    start, *body = sent
    assert start["type"] == "http.response.start" and start["status"] == 200
    headers = dict(start["headers"])
    assert headers[b"content-type"].startswith(b"text/event-stream")
    assert (headers[b"cache-control"], headers[b"x-accel-buffering"]) == (b"no-cache", b"no")
    assert [(m["type"], m["body"], m["more_body"]) for m in body] == [
        ("http.response.body", b"data: 1\n\n", True), ("http.response.body", b"data: 2\n\n", True),
        ("http.response.body", b"", False)]


@pytest.mark.parametrize("spec_version", SPEC_VERSIONS)
def test_a_connection_broken_under_a_write_ends_the_response_quietly(spec_version):
    sent = []

    async def send(message):
        if message.get("body"):
            raise OSError("connection reset")
        sent.append(message)

    response = EventStreamResponse(chunks(b"data: 1\n\n", b"data: 2\n\n"), media_type="text/event-stream")
    asyncio.run(response(http_scope(spec_version), no_receive, send))  # no ClientDisconnect, no OSError
    assert [m["type"] for m in sent] == ["http.response.start"]


class Engine:
    """The engine loop's end of the pipes: admits each job, and records what the HTTP side sent."""

    def __init__(self, frontend: Frontend):
        self.frontend = frontend
        self.received = []

    def send(self, message):
        self.received.append(message)
        uid, _, job = message
        if isinstance(job, GenerateJob):
            asyncio.get_running_loop().call_soon(self.frontend._route, [(uid, Admitted(prompt_tokens=3))])


class Client:
    """The client's side of `receive`: the body, then a disconnect once it leaves."""

    def __init__(self, body: dict):
        self.body = json.dumps(body).encode()
        self.leave = asyncio.Event()
        self.waiting = 0  # readers waiting for the disconnect

    async def receive(self):
        if self.body:
            body, self.body = self.body, b""
            return {"type": "http.request", "body": body, "more_body": False}
        self.waiting += 1
        await self.leave.wait()
        return {"type": "http.disconnect"}


@pytest.mark.parametrize("spec_version", SPEC_VERSIONS)
def test_a_chat_stream_streams_and_is_aborted_when_the_client_leaves(spec_version):
    """The whole route in one event loop: its Channel, the only reader of `receive`, notices the client
    going, the body ends, and the request is aborted in the engine."""
    cfg = {"server": {"limits": {"request_timeout_s": 60, "max_queued_requests": 4}, "served_model_name": "m",
                      "allowed_local_media_dir": None},
           "model": {"name": "m", "tool_call_parser": None}}

    async def main():
        frontend = Frontend(cfg, SharedState(), requests=None, events=None)
        engine = frontend.writer = Engine(frontend)
        routes = GenerateRoutes(frontend, OmegaConf.create(cfg), sampling={})
        client = Client({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True})
        response = await routes.chat(Request(http_scope(spec_version), client.receive))
        assert isinstance(response, EventStreamResponse)
        (uid, _, job), = engine.received
        assert isinstance(job, GenerateJob) and list(frontend.channels) == [uid]

        bodies = asyncio.Queue()

        async def send(message):
            if message["type"] == "http.response.body":
                await bodies.put(message)

        streaming = asyncio.create_task(response(http_scope(spec_version), client.receive, send))
        frontend._route([(uid, Tokens("Hel", 3, 1))])
        first = await asyncio.wait_for(bodies.get(), 10)
        assert first["more_body"] and b'"role":"assistant"' in first["body"] and b'"Hel"' in first["body"]
        frontend._route([(uid, Tokens("lo", 3, 2))])
        second = await asyncio.wait_for(bodies.get(), 10)
        assert b'"lo"' in second["body"]
        assert client.waiting == 1  # the Channel alone waits for the disconnect

        client.leave.set()
        await asyncio.wait_for(streaming, 10)
        last = await asyncio.wait_for(bodies.get(), 10)
        assert (last["body"], last["more_body"]) == (b"", False)  # ended without [DONE]: nobody reads it
        assert bodies.empty() and frontend.channels == {}
        assert [type(m[2]) for m in engine.received] == [GenerateJob, Abort] and engine.received[1][0] == uid

    asyncio.run(main())
