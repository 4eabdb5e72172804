"""`appliance serve` as a real process on 127.0.0.1: started, awaited healthy, stopped (with every
worker it started) by the test that uses it."""
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest import REPO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(*overrides, cwd, conf_dir=None, startup_s: float = 120):
    """Yields the base URL of `appliance serve OVERRIDES server.port=<free>`; on exit SIGTERMs it and
    fails if any process of its session is still alive 15 s later (they are killed either way)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("APPLIANCE_CONF_DIR", None)
    if conf_dir is not None:
        env["APPLIANCE_CONF_DIR"] = str(conf_dir)
    proc = subprocess.Popen(
        [sys.executable, "-m", "appliance.cli", "serve", *map(str, overrides), f"server.port={port}"],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_s
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail("server did not become healthy")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 15  # workers and the resource tracker exit just after the server
        while (leftovers := session_processes(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid in leftovers:  # never leave a server behind, even when the test fails
            os.kill(pid, signal.SIGKILL)
        assert not leftovers, f"serve left processes behind after SIGTERM: {leftovers}"


def session_processes(session_id: int):
    """PIDs still alive in the server's session (it and every worker it started)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == session_id:
                    pids.append(int(entry))
            except ProcessLookupError:
                pass
    return pids
