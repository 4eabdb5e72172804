"""Limits, disconnects and shutdown of a real `appliance serve` process.

The module's server runs a tiny random Llama with a long context whose every engine step takes 10 ms
(tests/serving/slow_llama.py: an answer of N tokens takes N/100 s on any host), one sequence at a time
(the others wait in the queue), a queue bound of 2, a small body limit and a 12 s request deadline. The
last test stops it.
"""
import json
import signal
import threading
import time

import httpx
import pytest

from tests.server_process import server_process
from tests.servers import error, metrics, wait_idle
from tests.serving.slow_llama import build_slow_checkpoint

MAX_BYTES = 300_000
TIMEOUT_S = 12
HELLO = [{"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = build_slow_checkpoint(tmp_path_factory.mktemp("long_llama"))
    with server_process("pipeline=llava_chat", "plugins=[tests.serving.slow_llama]", f"model.path={model}",
                        "model.name=long-llama",
                        "model.architecture=LlamaForCausalLM", "model.vision_language=null",
                        "engine.max_num_seqs=1", "server.limits.max_queued_requests=2",
                        f"server.limits.max_request_bytes={MAX_BYTES}", "server.drain_timeout_s=60",
                        f"server.limits.request_timeout_s={TIMEOUT_S}",
                        cwd=tmp_path_factory.mktemp("limits")) as srv:
        yield srv


def chat(base, messages=HELLO, timeout=120, **body):
    return httpx.post(f"{base}/v1/chat/completions", json={"messages": messages, "max_tokens": 8, **body},
                      timeout=timeout)


def long_stream_body(max_tokens=4000):
    return {"messages": HELLO, "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True}


def wait_for(base, name, value, timeout=30.0):
    deadline = time.monotonic() + timeout
    while metrics(base)[(name, ())] != value:
        assert time.monotonic() < deadline, f"{name} never reached {value}"
        time.sleep(0.05)


def test_body_over_the_limit_is_413_before_it_is_read(server):
    big = {"messages": [{"role": "user", "content": "x" * (MAX_BYTES + 10)}]}
    response = httpx.post(f"{server.base}/v1/chat/completions", json=big, timeout=30)
    assert response.status_code == 413 and "server.limits.max_request_bytes" in error(response)["message"]

    def chunks():  # no Content-Length: the limit applies while the body streams in
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(40):
            yield b"y" * 10_000
        yield b'"}]}'

    streamed = httpx.post(f"{server.base}/v1/chat/completions", content=chunks(), timeout=30)
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
        wait_for(server.base, "appliance_num_requests_waiting", 2)  # one sequence at a time: they wait
        started = time.monotonic()
        refused = chat(server.base)
        assert refused.status_code == 429, refused.text
        assert time.monotonic() - started < 2.0 and refused.headers["Retry-After"] == "1"
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


def test_an_error_after_the_stream_started_is_an_error_event(server):
    started = time.monotonic()
    with httpx.stream("POST", f"{server.base}/v1/chat/completions", json=long_stream_body(2000),
                      timeout=60) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line]
    assert TIMEOUT_S <= time.monotonic() - started < TIMEOUT_S + 5
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2][6:])
    assert last["error"]["code"] == 504 and "request_timeout_s" in last["error"]["message"], last
    assert len(lines) > 10  # tokens streamed before the deadline
    assert wait_idle(server.base)[("appliance_kv_cache_usage_perc", ())] == 0


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

    deadline = time.monotonic() + 30
    while admitted() < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    refused = chat(server.base)
    assert refused.status_code == 503 and "shutting down" in error(refused)["message"], refused.text
    assert httpx.get(f"{server.base}/ready", timeout=10).status_code == 503
    for thread in threads:
        thread.join(120)
    assert server.proc.wait(timeout=60) == 0
    assert len(results) == 2
    for lines in results:
        assert lines[-1] == "data: [DONE]"
        chunks = [json.loads(line[6:]) for line in lines[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert sum(1 for c in chunks if c["choices"][0]["delta"].get("content")) > 150
