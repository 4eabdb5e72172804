"""The chat page against servers of its own: one with `server.api_key` (401, the page asks for the key and
shows nothing of the server's state until given it, then the status strip and the chat work) and one whose every
step takes 10 ms (tests/serving/slow_llama.py), where Stop
(Esc) ends the answer mid-stream and the server aborts the request."""
import json

import pytest

from tests.server_process import server_process
from tests.servers import LLAVA_TINY, metrics, wait_idle
from tests.serving.slow_llama import build_slow_checkpoint
from tests.ui.test_chat_page import last_answer, open_settings, other_problems, send

KEY = "page-key-42"


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory):
    if not (LLAVA_TINY / "config.json").is_file():
        pytest.skip("appliance/assets/models/llava_tiny is missing")
    with server_process("pipeline=llava_chat", f"server.api_key={KEY}", cwd=tmp_path_factory.mktemp("keyed")) as server:
        yield server


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory):
    model = build_slow_checkpoint(tmp_path_factory.mktemp("slow_llama"))
    with server_process("pipeline=llava_chat", "plugins=[tests.serving.slow_llama]", f"model.path={model}",
                        "model.name=slow-llama", "model.architecture=LlamaForCausalLM",
                        "model.vision_language=null", cwd=tmp_path_factory.mktemp("slow")) as server:
        yield server


def test_with_an_api_key_the_page_asks_for_it_then_the_chat_works(keyed_server, open_page):
    page = open_page(f"{keyed_server.base}/")
    page.wait_for_selector("#key-dialog[open]")  # /v1/models answered 401
    page.fill("#key-input", "wrong")
    page.click("#key-form button[type=submit]")
    page.wait_for_selector("#key-reason >> text=The key was refused")
    assert page.text_content("#status") == ""
    assert not [url for url in page.requested if url.endswith(("/ready", "/metrics"))], page.requested
    page.fill("#key-input", KEY)
    page.click("#key-form button[type=submit]")
    page.wait_for_selector("#model >> text=llava-tiny")
    page.wait_for_selector("#status .state.ready")
    open_settings(page, temperature=0, max_tokens=8)
    with page.expect_request("**/v1/chat/completions") as sent:
        send(page, "Hello")
    answer = last_answer(page)
    assert answer.locator(".error").is_hidden() and answer.locator(".text").text_content()
    assert sent.value.headers["authorization"] == f"Bearer {KEY}"
    assert KEY not in page.url
    assert page.evaluate("sessionStorage.getItem('appliance.apiKey')") == KEY
    assert page.evaluate("JSON.stringify(localStorage)").find(KEY) == -1
    assert other_problems(page, 401) == []


def test_stop_ends_the_answer_mid_stream_and_the_server_aborts_it(slow_server, open_page):
    page = open_page(f"{slow_server.base}/")
    open_settings(page, max_tokens=4000)  # 40 s at 10 ms a step: it is stopped long before

    def never_eos(route):  # the test's knob: a random model's end-of-text would end the answer early
        route.continue_(post_data=json.dumps({**json.loads(route.request.post_data), "ignore_eos": True}))

    page.route("**/v1/chat/completions", never_eos)
    send(page, "Hello")
    page.wait_for_selector(".message.assistant .text:not(:empty)")
    assert page.is_visible("#stop") and page.is_hidden("#send")
    page.keyboard.press("Escape")
    answer = last_answer(page)
    assert "finish: stopped" in answer.locator(".stats").text_content()
    assert page.is_visible("#send") and page.is_hidden("#stop")
    now = wait_idle(slow_server.base)
    assert now[("appliance_num_requests_running", ())] == 0
    assert metrics(slow_server.base)[("appliance_request_success_total", (("finished_reason", "abort"),))] == 1
    assert [p for p in page.problems if "ERR_ABORTED" not in p] == []
