#!/usr/bin/env python
"""The HTTP process's own work per streamed chat request, without uvicorn or sockets.

    .venv/bin/python benchmarks/serve_path.py                 # one build: the checkout it runs from
    (cd /tmp/base && /work/main/.venv/bin/python /work/main/benchmarks/serve_path.py)   # another build

Drives a FastAPI app built as the server builds its own (the chat route, the error handlers and
`middleware.Gate`) straight from an event loop, with ASGI `receive`/`send` stand-ins, against a
stand-in engine: a forked process on another CPU that answers every job on the real pipes with
`Admitted` and one final `Tokens` event. So what is timed is the route's whole path in the HTTP process
(the middleware, the body, parsing, the channel, the job's pickle and pipe write, the events' routing,
the SSE answer, the metrics), and nothing of uvicorn, the sockets or the engine. The event loop's
thread CPU per request is printed per round; rounds differ by the host's noise, so compare builds by
alternating them.
"""
import argparse
import asyncio
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="serve-path-metrics-"))
sys.path.insert(0, str(Path.cwd()))  # the checkout it runs from (another build: cd into it)
sys.path.insert(1, str(Path(__file__).resolve().parent))

import uvloop
from omegaconf import OmegaConf
from fastapi import FastAPI

import serve
from appliance.config.compose import compose
from appliance.serving import pipes
from appliance.serving.http.frontend import Frontend
from appliance.serving.messages import Admitted, Tokens
from appliance.serving.http.middleware import Gate
from appliance.serving.http.routes_generate import GenerateRoutes
from appliance.stages.engine_stage import sampling_defaults
from appliance.serving.http.errors import APIError, api_error_handler
from appliance.serving.state import READY, SharedState

PATH = "/v1/chat/completions"


def stand_in_engine(requests_fd: int, events_fd: int, cpus) -> None:
    os.sched_setaffinity(0, cpus)
    while True:
        uid, _, job = pipes.receive(requests_fd)
        if hasattr(job, "request"):  # a job, not an abort
            pipes.send(events_fd, [(uid, Admitted(20)), (uid, Tokens("A red", 20, 2, None, "stop", final=True))])


def build_gate():
    cfg = compose(["pipeline=llava_chat"])
    shared = SharedState()
    shared.set_phase(READY)
    requests_rx, requests_tx = mp.Pipe(duplex=False)
    events_rx, events_tx = mp.Pipe(duplex=False)
    frontend = Frontend(OmegaConf.to_container(cfg, resolve=True), shared, requests_tx, events_rx)
    app = FastAPI()
    app.add_api_route(PATH, GenerateRoutes(frontend, cfg, sampling_defaults(cfg)).chat, methods=["POST"])
    app.add_exception_handler(APIError, api_error_handler)
    app.add_middleware(Gate, routes=[PATH], metrics=frontend.http_metrics, max_bytes=1 << 26, api_key=None)
    return app, requests_rx, events_tx  # the engine's ends: kept open while the benchmark runs


async def one_request(gate, body: bytes) -> None:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5555), "root_path": "",
             "path": PATH, "raw_path": PATH.encode(), "query_string": b"",
             "headers": [(b"host", b"bench"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}
    answered = asyncio.Event()
    body_sent = False

    async def receive():
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await answered.wait()  # the client stays until its answer ends
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.body" and not message.get("more_body"):
            answered.set()

    await gate(scope, receive, send)


async def rounds(gate, body: bytes, requests: int, concurrency: int, count: int) -> list:
    gate_open = asyncio.Semaphore(concurrency)

    async def limited():
        async with gate_open:
            await one_request(gate, body)

    await asyncio.gather(*[limited() for _ in range(concurrency)])  # warm-up
    per_request = []
    for _ in range(count):
        start = time.thread_time()
        await asyncio.gather(*[limited() for _ in range(requests)])
        per_request.append((time.thread_time() - start) / requests)
    return per_request


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[-1]})  # the event loop on one CPU, the stand-in engine on another
    gate, requests_rx, events_tx = build_gate()
    engine_args = (requests_rx.fileno(), events_tx.fileno(), {cpus[0]})
    mp.get_context("fork").Process(target=stand_in_engine, args=engine_args, daemon=True).start()
    messages = serve.llava_messages(tempfile.mkdtemp(), 1)[0]
    body = serve.streamed_chat({"messages": messages, "temperature": 0, "max_tokens": 16})
    per_request = uvloop.run(rounds(gate, body, args.requests, args.concurrency, args.rounds))
    print(f"{Path.cwd().name}: event-loop CPU per streamed request, {args.requests} requests a round, "
          f"{args.concurrency} in flight: median {sorted(per_request)[len(per_request) // 2] * 1e6:.1f} µs "
          f"[{' '.join(f'{s * 1e6:.1f}' for s in per_request)}]")


if __name__ == "__main__":
    main()
