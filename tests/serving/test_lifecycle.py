"""Limits, disconnects and shutdown of a real `appliance serve` process.

The module's server runs a tiny random Llama with a long context whose every engine step takes 10 ms
(tests/serving/slow_llama.py: an answer of N tokens takes N/100 s on any host), one sequence at a time
(the others wait in the queue), a queue bound of 2 and a small body limit. Its request deadline is the
default (600 s): on a busy host a queued stream must not meet a deadline the test is not about. The
deadline test runs its own server with a short one. The last test stops the module's server.
"""
import json
import signal
import threading
import time

import httpx
import pytest

from tests.server_process import server_process
from tests.servers import error, metrics, wait_for_metric, wait_idle
from tests.serving.slow_llama import build_slow_checkpoint

MAX_BYTES = 300_000
TIMEOUT_S = 5
HELLO = [{"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory):
    return build_slow_checkpoint(tmp_path_factory.mktemp("long_llama"))


def slow_server(model, cwd, *overrides):
    return server_process("pipeline=llava_chat", "plugins=[tests.serving.slow_llama]", f"model.path={model}",
                          "model.name=long-llama", "model.architecture=LlamaForCausalLM",
                          "model.vision_language=null", "engine.max_num_seqs=1", *overrides, cwd=cwd)


@pytest.fixture(scope="module")
def server(slow_model, tmp_path_factory):
    with slow_server(slow_model, tmp_path_factory.mktemp("limits"), "server.limits.max_queued_requests=2",
                     f"server.limits.max_request_bytes={MAX_BYTES}", "server.drain_timeout_s=120") as srv:
        yield srv


def chat(base, messages=HELLO, timeout=120, **body):
    return httpx.post(f"{base}/v1/chat/completions", json={"messages": messages, "max_tokens": 8, **body},
                      timeout=timeout)


def long_stream_body(max_tokens=4000):
    return {"messages": HELLO, "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True}


def events(lines):
    """The JSON events of an SSE stream that ended with `data: [DONE]`."""
    assert lines[-1] == "data: [DONE]", lines[-3:]
    return [json.loads(line[6:]) for line in lines[:-1]]


def answer_chunks(lines):
    """The answer chunks of a stream, after checking that no event is an error."""
    chunks = events(lines)
    errors = [chunk["error"] for chunk in chunks if "error" in chunk]
    assert not errors, errors
    return chunks


def test_body_over_the_limit_is_413_before_it_is_read(server):
    big = {"messages": [{"role": "user", "content": "x" * (MAX_BYTES + 10)}]}
    response = httpx.post(f"{server.base}/v1/chat/completions", json=big, timeout=30)
    assert response.status_code == 413 and "server.limits.max_request_bytes" in error(response)["message"]

    def chunks():  # no Content-Length: the limit applies while the body streams in
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(40):
            yield b"y" * 10_000
        yield b'"}]}'

    streamed = httpx.post(f"{server.base}/v1/chat/completions", content=chunks(), timeout=30,
                          headers={"Content-Type": "application/json"})
    assert streamed.status_code == 413, streamed.text
    assert chat(server.base).status_code == 200


def test_queue_full_is_429_at_once_and_a_disconnect_frees_the_request(server):
    before = metrics(server.base)
    with httpx.stream("POST", f"{server.base}/v1/chat/completions", json=long_stream_body(), timeout=60) as long:
        assert long.status_code == 200
        lines = long.iter_lines()
        assert next(lines).startswith("data: ")  # the role chunk: the long answer runs
        waiting = [threading.Thread(target=chat, args=(server.base,)) for _ in range(2)]
        for thread in waiting:
            thread.start()
        wait_for_metric(server.base, "appliance_num_requests_waiting", 2)  # one sequence at a time: they wait
        started = time.monotonic()
        refused = chat(server.base)
        assert refused.status_code == 429, refused.text
        # At once, not after a wait in the queue: the long answer alone holds the engine >= 40 s.
        assert time.monotonic() - started < 20 and refused.headers["Retry-After"] == "1"
        assert "max_queued_requests=2" in error(refused)["message"]
        next(lines)
    # The long answer's connection closed mid-stream: its blocks go, the waiting two run and finish.
    for thread in waiting:
        thread.join(60)
    after = wait_idle(server.base)
    assert after[("appliance_kv_cache_usage_perc", ())] == 0
    aborted = ("appliance_request_success_total", (("finished_reason", "abort"),))
    assert after.get(aborted, 0) - before.get(aborted, 0) == 1
    assert chat(server.base).status_code == 200


def test_an_error_after_the_stream_started_is_an_error_event(slow_model, tmp_path):
    # Its own server: a short deadline that a 4000-token answer (>= 40 s at 10 ms a step) always meets.
    with slow_server(slow_model, tmp_path, f"server.limits.request_timeout_s={TIMEOUT_S}") as deadline_server:
        started = time.monotonic()
        with httpx.stream("POST", f"{deadline_server.base}/v1/chat/completions", json=long_stream_body(4000),
                          timeout=120) as response:
            assert response.status_code == 200
            lines = [line for line in response.iter_lines() if line]
        assert time.monotonic() - started >= TIMEOUT_S
        *chunks, last = events(lines)
        assert "error" in last, last
        assert last["error"]["code"] == 504 and "request_timeout_s" in last["error"]["message"], last
        assert all("error" not in chunk for chunk in chunks)
        assert sum(1 for c in chunks if c["choices"][0]["delta"].get("content")) >= 1  # streamed first
        assert wait_idle(deadline_server.base)[("appliance_kv_cache_usage_perc", ())] == 0


def test_sigterm_drains_running_streams_then_exits_zero(server):
    results = []

    def stream():
        with httpx.stream("POST", f"{server.base}/v1/chat/completions", json=long_stream_body(250),
                          timeout=120) as response:
            results.append([line for line in response.iter_lines() if line])

    threads = [threading.Thread(target=stream) for _ in range(2)]
    for thread in threads:
        thread.start()
    def admitted():  # both streams in the engine (one running, one waiting: max_num_seqs=1)
        sample = metrics(server.base)
        return sample[("appliance_num_requests_running", ())] + sample[("appliance_num_requests_waiting", ())]

    deadline = time.monotonic() + 120
    while admitted() < 2:
        assert time.monotonic() < deadline, "the two streams never reached the engine"
        time.sleep(0.05)
    server.proc.send_signal(signal.SIGTERM)
    while httpx.get(f"{server.base}/ready", timeout=30).status_code != 503:  # the signal has landed
        assert time.monotonic() < deadline + 60, "/ready still answers 200 after SIGTERM"
        time.sleep(0.05)
    refused = chat(server.base)
    assert refused.status_code == 503 and "shutting down" in error(refused)["message"], refused.text
    for thread in threads:
        thread.join(300)
    assert server.proc.wait(timeout=120) == 0
    assert len(results) == 2
    for lines in results:
        chunks = answer_chunks(lines)
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert sum(1 for c in chunks if c["choices"][0]["delta"].get("content")) > 150
