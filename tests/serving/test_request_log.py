"""What `appliance serve` logs: one line per request (server.access_log), the engine's stats line
(server.stats_interval_s), one line shape for all three processes, and JSON lines (log_format=json).
Each test runs its own server, whose output it reads."""
import base64
import json
import re
import time

import httpx
import pytest

from tests.conftest import FRAME_CONF
from tests.server_process import server_process
from tests.servers import LLAVA_TINY, SAMPLE_SCENE

KEY = "log-test-key-5f1e"
SECRET_TEXT = "zebra-quartz-prompt"  # a body's text, which must never reach the log
LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")
INTERVAL_S = 0.2


def wait_for(server, predicate, timeout_s: float = 60):
    """Poll the server's output until `predicate(lines)` holds; its value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = predicate(server.output().splitlines())
        if found:
            return found
        time.sleep(0.05)
    pytest.fail(f"not in the server's output:\n{server.output()[-3000:]}")


def request_lines(lines, path):
    return [line for line in lines if " appliance.access: " in line and f" {path} " in line]


def fields_of(line: str) -> dict:
    return dict(pair.split("=", 1) for pair in line.split() if "=" in pair)


@pytest.fixture(scope="module")
def chat_server(tmp_path_factory):
    if not (LLAVA_TINY / "config.json").is_file():
        pytest.skip("appliance/assets/models/llava_tiny is missing")
    with server_process("pipeline=llava_chat", f"server.api_key={KEY}", f"server.stats_interval_s={INTERVAL_S}",
                        cwd=tmp_path_factory.mktemp("logged_chat")) as server:
        yield server


def chat(server, **extra):
    body = {"messages": [{"role": "user", "content": f"say {SECRET_TEXT}"}], "max_tokens": 4, "temperature": 0,
            **extra}
    return httpx.post(f"{server.base}/v1/chat/completions?api_key={KEY}", json=body,
                      headers={"Authorization": f"Bearer {KEY}"}, timeout=120)


def test_chat_requests_are_logged_with_their_tokens_and_without_secrets(chat_server):
    plain = chat(chat_server)
    assert plain.status_code == 200, plain.text
    streamed = chat(chat_server, stream=True, stream_options={"include_usage": True})
    assert streamed.status_code == 200
    usage = json.loads(streamed.text.split("data: ")[-2])["usage"]
    refused = chat(chat_server, max_tokens=-1)
    assert refused.status_code == 400

    lines = wait_for(chat_server, lambda lines: len(request_lines(lines, "/v1/chat/completions")) >= 3 and lines)
    logged = {fields_of(line)["request_id"]: line for line in request_lines(lines, "/v1/chat/completions")}
    ok = logged[plain.json()["id"]]
    assert re.search(r"INFO appliance\.access: POST /v1/chat/completions 200 \d+\.\d ms ", ok)
    assert fields_of(ok)["prompt_tokens"] == str(plain.json()["usage"]["prompt_tokens"])
    assert fields_of(ok)["completion_tokens"] == str(plain.json()["usage"]["completion_tokens"])
    stream_id = json.loads(streamed.text.split("data: ")[1])["id"]
    assert fields_of(logged[stream_id])["completion_tokens"] == str(usage["completion_tokens"])
    assert fields_of(logged[stream_id])["prompt_tokens"] == str(usage["prompt_tokens"])
    bad = [line for line in logged.values() if " 400 " in line]
    assert len(bad) == 1 and fields_of(bad[0])["request_id"].startswith("chatcmpl-")

    output = chat_server.output()
    assert KEY not in output and SECRET_TEXT not in output and "api_key" not in output
    # one line shape for the main, HTTP and engine processes (LitServe's and uvicorn's lines included)
    assert all(LINE.match(line) for line in output.splitlines() if line.strip()), output
    for logger in ("appliance.serving.server", "appliance.access", "appliance.serving.engine_process.loop"):
        assert f" INFO {logger}: " in output


def test_polls_stay_out_of_the_info_log_and_start_up_has_no_stray_lines(chat_server):
    for path in ("/health", "/ready", "/metrics"):
        assert httpx.get(f"{chat_server.base}{path}").status_code == 200
    assert httpx.get(f"{chat_server.base}/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    lines = wait_for(chat_server, lambda lines: request_lines(lines, "/v1/models") and lines)
    assert [request_lines(lines, path) for path in ("/health", "/ready", "/metrics")] == [[], [], []]
    assert not [line for line in lines if " root: " in line or "LitServe will use" in line], lines


def test_the_stats_line_comes_with_traffic_and_stops_when_idle(chat_server):
    def stats():
        return [line for line in chat_server.output().splitlines() if " appliance.stats: " in line]

    def settled():
        """No stats line for five intervals (an idle server's); a server that never went quiet fails."""
        count = len(stats())
        time.sleep(5 * INTERVAL_S)
        return len(stats()) == count

    before = len(stats())
    for _ in range(3):
        assert chat(chat_server).status_code == 200
    wait_for(chat_server, lambda lines: settled())
    active = stats()[before:]
    assert active and all(re.search(r"prompt throughput: \d+\.\d tokens/s, generation throughput: \d+\.\d "
                                     r"tokens/s, running: \d+ reqs, waiting: \d+ reqs, KV cache usage: \d+\.\d%$",
                                     line) for line in active)
    assert any(not line.split("generation throughput: ")[1].startswith("0.0 ") for line in active)
    # the interval in which the last request finished ended with nothing running or waiting
    assert "running: 0 reqs, waiting: 0 reqs" in active[-1]
    quiet = len(stats())
    time.sleep(10 * INTERVAL_S)  # ten more intervals of the idle server
    assert len(stats()) == quiet


def test_json_lines_for_a_pooling_server(tmp_path):
    with server_process("pipeline=prithvi_flood", "server.served_model_name=flood", "log_format=json",
                        f"server.stats_interval_s={INTERVAL_S}", f"server.api_key={KEY}", cwd=tmp_path) as server:
        body = {"model": "flood", "data": {"data": base64.b64encode(SAMPLE_SCENE.read_bytes()).decode(),
                                           "data_format": "b64_json", "out_data_format": "b64_json"}}
        response = httpx.post(f"{server.base}/pooling", json=body, headers={"x-api-key": KEY}, timeout=120)
        assert response.status_code == 200, response.text
        wait_for(server, lambda lines: any('"tiles_per_s"' in line for line in lines)
                 and any('"/pooling"' in line for line in lines))
    records = [json.loads(line) for line in server.output().splitlines() if line.strip()]
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    loggers = {r["logger"] for r in records}
    assert {"appliance.serving.server", "appliance.access", "appliance.serving.engine_process.loop"} <= loggers
    request = next(r for r in records if r["logger"] == "appliance.access" and r["path"] == "/pooling")
    assert request["method"] == "POST" and request["status"] == 200
    assert request["request_id"] == response.json()["request_id"]
    assert request["tiles"] >= 1 and request["duration_ms"] > 0
    assert request["message"].startswith("POST /pooling 200 ")
    stats = [r for r in records if r["logger"] == "appliance.stats"]
    assert any(r["tiles_per_s"] > 0 for r in stats) and {"running", "waiting"} <= set(stats[0])
    assert KEY not in server.output() and body["data"]["data"][:40] not in server.output()


def test_access_log_false_writes_no_request_lines(tmp_path):
    (tmp_path / "media").mkdir()
    numbers = tmp_path / "media" / "n.txt"
    numbers.write_text("2 4\n")
    with server_process("server.access_log=false", f"server.allowed_local_media_dir={tmp_path / 'media'}",
                        cwd=tmp_path, conf_dir=FRAME_CONF) as server:
        answer = httpx.post(f"{server.base}/predict", json={"input": str(numbers)}, timeout=60)
        assert answer.status_code == 200, answer.text
        assert httpx.get(f"{server.base}/nowhere", timeout=60).status_code == 404
    assert "ready:" in server.output() and "appliance.access" not in server.output()
