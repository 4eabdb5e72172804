"""The supervisor says ready only once a request to its address reached its own HTTP process."""
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from appliance.errors import ConfigError
from appliance.serving.server import Supervisor
from appliance.serving.state import READY, SharedState
from tests.server_process import free_port


class Healthy(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def other_server():
    """Some HTTP server on a port of its own (standing in for whatever answers on the address)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Healthy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def supervisor(port):
    shared = SharedState()
    shared.set_phase(READY)
    litserver = SimpleNamespace(_shutdown_event=threading.Event(), inference_workers=[])
    return Supervisor(litserver, shared, 1.0, address=("127.0.0.1", port), ready_line="ready: test"), litserver


def test_nothing_listening_yet_is_no_announcement_and_no_failure():
    sup, litserver = supervisor(free_port())
    sup._announce_when_reachable()
    assert not sup.announced and sup.failure is None and not litserver._shutdown_event.is_set()


def test_an_answer_from_another_process_stops_the_server_with_exit_2(other_server, caplog):
    sup, litserver = supervisor(other_server)
    with caplog.at_level(logging.INFO):
        sup._announce_when_reachable()
    assert isinstance(sup.failure, ConfigError) and sup.exit_code == 2
    assert f"another process answers on 127.0.0.1:{other_server}" in str(sup.failure)
    assert litserver._shutdown_event.is_set() and not sup.announced
    assert "ready: test" not in caplog.text


def test_an_answer_marked_by_our_http_process_is_announced_once(other_server, caplog):
    sup, litserver = supervisor(other_server)
    sup.shared.mark_listening()  # what our HTTP process does when it answers
    with caplog.at_level(logging.INFO):
        sup._announce_when_reachable()
    assert sup.announced and sup.failure is None and not litserver._shutdown_event.is_set()
    assert caplog.text.count("ready: test") == 1


def test_the_server_is_marked_stopping_before_litserve_stops_its_processes():
    """Its children read the mark when a SIGTERM arrives that may hide their parent's (stop_signals.py)."""
    sup, litserver = supervisor(free_port())
    marked_when_stopped = []
    litserver._shutdown_event = SimpleNamespace(set=lambda: marked_when_stopped.append(sup.shared.stopping))
    assert not sup.shared.stopping
    sup.stop()
    assert marked_when_stopped == [True]
