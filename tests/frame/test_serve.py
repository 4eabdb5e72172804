"""`appliance serve` as a real server process on 127.0.0.1, started and stopped by the test."""
import socket
import threading
import time

import httpx
import pytest

from tests.conftest import FRAME_CONF, assert_user_error, run_cli
from tests.server_process import free_port, running_server, server_process


@pytest.fixture
def server(tmp_path):
    (tmp_path / "media").mkdir()  # the server refuses a media directory that is not there
    with running_server("server.api_key=s3cret", f"server.allowed_local_media_dir={tmp_path / 'media'}",
                        cwd=tmp_path, conf_dir=FRAME_CONF) as base:
        yield base


def test_serve_runs_the_pipeline_and_rejects_bad_requests(server, tmp_path):
    numbers = tmp_path / "media" / "n.txt"
    numbers.write_text("2 4\n")
    outside = tmp_path / "secret.txt"
    outside.write_text("1\n")
    auth = {"Authorization": "Bearer s3cret"}
    ok = httpx.post(f"{server}/predict", json={"input": str(numbers)}, headers=auth, timeout=60)
    assert ok.status_code == 200, ok.text
    assert ok.json() == {"results": [{"display": "total 12"}]}

    assert httpx.post(f"{server}/predict", json={"input": str(numbers)}, timeout=60).status_code == 401
    unknown = httpx.post(f"{server}/predict", json={"inptu": "x"}, headers=auth, timeout=60)
    assert unknown.status_code == 400 and "inptu" in message(unknown)
    assert unknown.json()["error"]["param"] == "inptu"
    escape = httpx.post(f"{server}/predict", json={"input": str(outside)}, headers=auth, timeout=60)
    assert escape.status_code == 400 and "outside the allowed directory" in message(escape)
    dotdot = httpx.post(f"{server}/predict", json={"input": "../secret.txt"}, headers=auth, timeout=60)
    assert dotdot.status_code == 400
    missing = httpx.post(f"{server}/predict", json={"input": str(tmp_path / "media" / "nope.txt")},
                         headers=auth, timeout=60)
    assert missing.status_code == 400 and "nope.txt" in message(missing)
    # The server keeps serving after bad requests.
    again = httpx.post(f"{server}/predict", json={"input": str(numbers)}, headers=auth, timeout=60)
    assert again.status_code == 200


def message(response) -> str:
    return response.json()["error"]["message"]


def test_paths_are_refused_unless_the_server_allows_a_directory(frame_conf, tmp_path):
    from appliance.config.compose import compose
    from appliance.serving.http.errors import APIError
    from appliance.serving.http.routes_ops import PredictRoute

    closed = PredictRoute(None, compose([]))
    with pytest.raises(APIError) as info:
        closed._resolve("input", str(tmp_path / "n.txt"))
    assert info.value.status == 400 and "allowed_local_media_dir" in info.value.message
    opened = PredictRoute(None, compose([f"server.allowed_local_media_dir={tmp_path}"]))
    assert opened._resolve("input", str(tmp_path / "n.txt")) == str(tmp_path.resolve() / "n.txt")
    # A relative name is taken from the allowed directory, whatever the server's working directory.
    assert opened._resolve("input", ["n.txt", None]) == [str(tmp_path.resolve() / "n.txt"), None]
    with pytest.raises(APIError):
        opened._resolve("input", [str(tmp_path / "a.txt"), "/etc/passwd"])
    with pytest.raises(APIError) as info:  # the same rule as every route's: no NUL
        opened._resolve("input", "n.txt\0.png")
    assert "NUL" in info.value.message and info.value.param == "input"


def test_a_dead_engine_takes_the_server_down_with_exit_code_1(tmp_path):
    """The engine loop's process is killed: /health stops answering 200 and `serve` exits 1, so an
    orchestrator restarts it; no process is left behind."""
    import os
    import signal

    from tests.server_process import child_pids, server_process

    with server_process(cwd=tmp_path, conf_dir=FRAME_CONF) as srv:
        children = child_pids(srv.proc.pid)
        engine = [pid for pid in children if b"spawn_main" in open(f"/proc/{pid}/cmdline", "rb").read()]
        assert len(engine) == 1, children
        os.kill(engine[0], signal.SIGKILL)
        assert srv.proc.wait(timeout=30) == 1
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{srv.base}/health", timeout=2)


def test_a_port_in_use_is_one_line_and_exit_2_before_any_announcement(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("serve", f"server.port={port}", conf_dir=FRAME_CONF, cwd=tmp_path)
    assert_user_error(result, "server.port", f"127.0.0.1:{port} is already in use")
    assert "starting" not in result.stdout + result.stderr


def test_a_second_server_started_on_the_same_port_exits_2_and_never_says_ready(tmp_path):
    """Started half a second apart, both would find the port free (neither listens before its model is
    loaded): the second one exits 2 with one line, the first one serves."""
    port, second = free_port(), {}

    def start_second():
        time.sleep(0.5)
        second["result"] = run_cli("serve", f"server.port={port}", conf_dir=FRAME_CONF, cwd=tmp_path)

    thread = threading.Thread(target=start_second)
    thread.start()
    with server_process(cwd=tmp_path, conf_dir=FRAME_CONF, port=port) as first:
        thread.join(300)
        assert httpx.get(f"{first.base}/ready", timeout=10).status_code == 200
    assert_user_error(second["result"], "server.port", f"127.0.0.1:{port}")
    assert "ready" not in second["result"].stdout + second["result"].stderr


@pytest.mark.parametrize("make, fragment", [(None, "does not exist"), ("file", "is not a directory")])
def test_a_media_directory_that_is_not_there_is_refused_at_start(tmp_path, make, fragment):
    media = tmp_path / "media"
    if make == "file":
        media.write_text("")
    result = run_cli("serve", f"server.allowed_local_media_dir={media}", conf_dir=FRAME_CONF, cwd=tmp_path)
    assert_user_error(result, "server.allowed_local_media_dir", fragment)


def test_start_up_lines_are_info_and_one_says_ready_with_the_url(tmp_path):
    with server_process(cwd=tmp_path, conf_dir=FRAME_CONF) as server:
        pass
    lines = server.output().splitlines()
    starting = next(i for i, line in enumerate(lines) if "starting pipeline" in line)
    ready = next(i for i, line in enumerate(lines) if " INFO appliance.serving.server: ready:" in line)
    assert " INFO appliance.serving.server: starting" in lines[starting] and starting < ready
    assert f"on {server.base} " in lines[ready] + " "


@pytest.mark.parametrize("setting, line", [
    ("server.scenes.preview_size=0", "server.scenes.preview_size: 0; allowed: 1 or more"),
    ("server.scenes.keep_s=-1", "server.scenes.keep_s: -1; allowed: more than 0"),
    ("server.scenes.max_kept=0", "server.scenes.max_kept: 0; allowed: 1 or more")])
def test_scene_settings_must_be_positive(tmp_path, setting, line):
    result = run_cli("serve", setting, conf_dir=FRAME_CONF, cwd=tmp_path)
    assert_user_error(result, line)
