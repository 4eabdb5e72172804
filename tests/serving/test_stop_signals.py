"""Stop signals as service managers send them, to a real `appliance serve` with requests in flight.

Each case signals the main process alone (Kubernetes, `docker stop`), its process group (Ctrl-C,
supervisord's stopasgroup) or every process of the server (systemd's KillMode=control-group), with
SIGTERM or SIGINT, once (the server drains: running requests finish) or twice (it stops at once: running
requests end with a 503). Every delivery and signal is met once and twice across the cases; the server
exits 0 with one line saying what happened, and prints no traceback.

Generate: a Llama whose every step takes 10 ms (tests/serving/slow_llama.py), two streams running. Pool:
the flood pipeline, two scenes whose URL answers only when the test lets it (their requests are in flight,
preparing, until then).
"""
import json
import os
import signal
import threading
import time

import httpx
import pytest

from tests.geo.hls import RangeServer
from tests.server_process import server_process, session_processes
from tests.servers import SAMPLE_SCENE, error, metrics
from tests.serving.slow_llama import build_slow_checkpoint

HELLO = [{"role": "user", "content": "Hello there"}]
CASES = [("pid", signal.SIGTERM, 1), ("pid", signal.SIGINT, 2), ("group", signal.SIGTERM, 2),
         ("group", signal.SIGINT, 1), ("every", signal.SIGTERM, 1), ("every", signal.SIGINT, 2)]
FAST = {("group", signal.SIGTERM, 2), ("every", signal.SIGTERM, 1)}  # the rest in the slow tier


def log_level(how, sig, times) -> str:
    """No traceback at any log level: the cases with the most to say run at DEBUG."""
    return f"log_level={'DEBUG' if (sig, times) == (signal.SIGINT, 2) else 'INFO'}"


def cases():
    return [pytest.param(how, sig, times, id=f"{how}-{sig.name}-x{times}",
                         marks=() if (how, sig, times) in FAST else pytest.mark.slow)
            for how, sig, times in CASES]


def deliver(proc, how: str, sig) -> None:
    if how == "pid":
        os.kill(proc.pid, sig)
    elif how == "group":
        os.killpg(proc.pid, sig)  # the server leads its own session (server_process)
    else:
        for pid in session_processes(proc.pid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def signal_and_check_refusal(server, how, sig, times, refused_request):
    """Deliver the signal, check the server drains (readiness fails, new requests get 503 with Retry-After),
    and deliver it again when `times` is 2."""
    deliver(server.proc, how, sig)
    deadline = time.monotonic() + 60
    while httpx.get(f"{server.base}/ready", timeout=30).status_code != 503:  # the signal has landed
        assert time.monotonic() < deadline, "/ready still answers 200 after the signal"
        time.sleep(0.05)
    refused = refused_request()
    assert refused.status_code == 503 and "shutting down" in error(refused)["message"], refused.text
    assert refused.headers["Retry-After"] == "1"
    if times == 2:
        deliver(server.proc, how, sig)


def check_exit(server, sig, times, requests: int) -> None:
    """Exit 0, one ready line, the stop line with its counts, and no traceback."""
    assert server.proc.wait(timeout=120) == 0
    output = server.output_at_exit()
    assert "Traceback" not in output and "Error:" not in output, output
    # every process stopped when told, none was killed (LitServe's warning before it kills one)
    assert "Did not terminate gracefully" not in output, output
    assert sum("ready: pipeline" in line for line in output.splitlines()) == 1, output
    if times == 1:
        assert f"stopped on {sig.name}: {requests} requests finished, 0 cut" in output, output
    else:
        assert (f"stopped at once on a second signal ({sig.name}): 0 requests finished, {requests} cut "
                "(ended with a 503)") in output, output


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory):
    return build_slow_checkpoint(tmp_path_factory.mktemp("slow_llama"))


@pytest.mark.parametrize("how, sig, times", cases())
def test_generate_streams_drain_or_end_cleanly(slow_model, tmp_path, how, sig, times):
    tokens = 300 if times == 1 else 4000  # 3 s or 40 s at 10 ms a step: the second signal finds them running
    results, started = [], threading.Semaphore(0)

    def stream():
        body = {"messages": HELLO, "max_tokens": tokens, "temperature": 0, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", f"{server.base}/v1/chat/completions", json=body, timeout=300) as response:
            lines = []
            for line in (line for line in response.iter_lines() if line):
                if not lines:
                    started.release()
                lines.append(line)
            results.append(lines)

    with server_process("pipeline=llava_chat", "plugins=[tests.serving.slow_llama]", f"model.path={slow_model}",
                        "model.name=slow-llama", "model.architecture=LlamaForCausalLM", "model.vision_language=null",
                        "server.drain_timeout_s=300", log_level(how, sig, times), cwd=tmp_path) as server:
        threads = [threading.Thread(target=stream) for _ in range(2)]
        for thread in threads:
            thread.start()
        for _ in threads:
            assert started.acquire(timeout=120), "a stream never started"

        def chat():
            return httpx.post(f"{server.base}/v1/chat/completions", json={"messages": HELLO, "max_tokens": 4},
                              timeout=60)
        signal_and_check_refusal(server, how, sig, times, chat)
        for thread in threads:
            thread.join(300)
        check_exit(server, sig, times, requests=2)
    assert len(results) == 2
    for lines in results:
        assert lines[-1] == "data: [DONE]", lines[-3:]
        last = json.loads(lines[-2][len("data: "):])
        if times == 1:
            assert last["choices"][0]["finish_reason"] == "length", last
            assert sum('"content"' in line for line in lines) > tokens // 2
        else:
            assert last["error"]["code"] == 503 and "stopped before this request finished" in last["error"]["message"]


@pytest.mark.parametrize("how, sig, times", cases())
def test_pooling_requests_drain_or_end_cleanly(tmp_path, how, sig, times):
    fetching, release = threading.Semaphore(0), threading.Event()

    def hold():  # every request for the scene waits here (the first GET of each job says it is in flight)
        fetching.release()
        release.wait(120)

    (tmp_path / "scene.tif").write_bytes(SAMPLE_SCENE.read_bytes())
    answers = []
    with RangeServer(tmp_path, before_answer=hold) as source, \
            server_process("pipeline=prithvi_flood", "server.allowed_media_domains=[127.0.0.1]",
                           "server.preprocess_workers=2", "server.drain_timeout_s=300", log_level(how, sig, times),
                           cwd=tmp_path) as server:
        body = {"data": {"data": f"{source.url}/scene.tif", "data_format": "url"}}
        def post():
            answers.append(httpx.post(f"{server.base}/pooling", json=body, timeout=300))
        threads = [threading.Thread(target=post) for _ in range(2)]
        try:
            for thread in threads:
                thread.start()
            for _ in threads:
                assert fetching.acquire(timeout=120), "a scene was never asked for"
            assert metrics(server.base)[("appliance_num_requests_waiting", ())] \
                + metrics(server.base)[("appliance_num_requests_running", ())] == 2
            signal_and_check_refusal(server, how, sig, times,
                                     lambda: httpx.post(f"{server.base}/pooling", json=body, timeout=60))
            if times == 2:
                for thread in threads:
                    thread.join(120)
        finally:
            release.set()
        for thread in threads:
            thread.join(300)
        check_exit(server, sig, times, requests=2)
    assert len(answers) == 2
    for response in answers:
        if times == 1:
            assert response.status_code == 200 and response.json()["data"]["data"], response.text
        else:
            assert response.status_code == 503 and "stopped before this request finished" in error(response)["message"]
