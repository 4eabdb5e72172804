"""`server.limits.max_queued_requests` counts requests, also while requests asking `n` answers run: the
engine reports the requests with an answer running, not its running sequences (n of them for one
request), so the queue the HTTP side counts is not shortened by the answers of running requests.

The server runs the slow tiny Llama of test_lifecycle.py (10 ms a step), four sequences at a time and
a queue bound of 1.
"""
import threading

import httpx
import pytest

from tests.server_process import server_process
from tests.servers import error, wait_for_metric, wait_idle
from tests.serving.slow_llama import build_slow_checkpoint
from tests.serving.test_lifecycle import HELLO, chat


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = build_slow_checkpoint(tmp_path_factory.mktemp("long_llama"))
    with server_process("pipeline=llava_chat", "plugins=[tests.serving.slow_llama]", f"model.path={model}",
                        "model.name=long-llama", "model.architecture=LlamaForCausalLM",
                        "model.vision_language=null", "engine.max_num_seqs=4",
                        "server.limits.max_queued_requests=1", "server.limits.request_timeout_s=60",
                        cwd=tmp_path_factory.mktemp("queue_n")) as srv:
        yield srv


def test_a_request_with_four_answers_running_leaves_a_queue_of_one(server):
    body = {"messages": HELLO, "max_tokens": 3000, "temperature": 0, "stream": True, "ignore_eos": True, "n": 4}
    with httpx.stream("POST", f"{server.base}/v1/chat/completions", json=body, timeout=60) as long:
        assert long.status_code == 200
        lines = long.iter_lines()  # held: a dropped iterator closes the response
        assert next(lines).startswith("data: ")
        wait_for_metric(server.base, "appliance_num_requests_running", 4)  # its four answers fill the engine
        waiting = threading.Thread(target=chat, args=(server.base,), kwargs={"n": 2})
        waiting.start()
        wait_for_metric(server.base, "appliance_num_requests_waiting", 2)  # its two answers wait: one request queued
        refused = chat(server.base)
        assert refused.status_code == 429, refused.text
        assert "1 requests waiting" in error(refused)["message"]
    waiting.join(60)  # the long request's connection closed: its answers go, the waiting request runs
    assert not waiting.is_alive()
    assert wait_idle(server.base)[("appliance_kv_cache_usage_perc", ())] == 0
    assert chat(server.base, n=3).status_code == 200
