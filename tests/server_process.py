"""`appliance serve` as a real process on 127.0.0.1: started, awaited ready, stopped (with every worker
it started) by the test that uses it."""
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import List, Optional

import httpx
import pytest

from tests.conftest import REPO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    base: str
    proc: subprocess.Popen
    reader: Optional[threading.Thread] = None
    lines: List[str] = field(default_factory=list)  # what it printed so far, read as it comes (a pipe nobody
    # read would fill with request log lines and stall the server)

    def output(self) -> str:
        """What the server printed so far; all of it once `server_process` stopped it."""
        return "".join(self.lines)

    def read_output(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    def output_at_exit(self, timeout: float = 60) -> str:
        """Everything it printed, once it exited and its processes closed their output."""
        self.reader.join(timeout)
        return self.output()


@contextlib.contextmanager
def server_process(*overrides, cwd, conf_dir=None, startup_s: float = 180, env=None, ready: bool = True,
                   port=None):
    """Yields a `Server` for `appliance serve OVERRIDES server.port=<port, else a free one>` once /ready
    answers 200 and it printed its ready line (with ready=False: once /health answers 200); on exit
    SIGTERMs it and fails if any process of its session is still alive 15 s later (they are killed either
    way)."""
    port = port or free_port()
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    full_env.pop("APPLIANCE_CONF_DIR", None)
    if conf_dir is not None:
        full_env["APPLIANCE_CONF_DIR"] = str(conf_dir)
    proc = subprocess.Popen(
        [sys.executable, "-m", "appliance.cli", "serve", *map(str, overrides), f"server.port={port}"],
        cwd=cwd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    server = Server(f"http://127.0.0.1:{port}", proc)
    reader = server.reader = threading.Thread(target=server.read_output, name="server-output", daemon=True)
    reader.start()
    probe = "/ready" if ready else "/health"
    try:
        deadline = time.monotonic() + startup_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                reader.join(timeout=10)
                pytest.fail(f"the server exited during start-up:\n{server.output()}")
            try:
                if httpx.get(f"{server.base}{probe}", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        else:
            pytest.fail(f"server did not answer {probe}")
        # The supervisor says ready a moment after /ready first answers 200 (it checks its own address
        # first); a test starts from a server that said so, as its user would.
        while ready and "ready: pipeline" not in server.output():
            if proc.poll() is not None or time.monotonic() > deadline:
                reader.join(timeout=10)
                pytest.fail(f"the server answered /ready but never said ready:\n{server.output()}")
            time.sleep(0.1)
        yield server
    finally:
        stop(proc)
        reader.join(timeout=10)  # the pipe ends with the server's last process


def stop(proc: subprocess.Popen, timeout: float = 60) -> None:
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + 15  # workers and the resource tracker exit just after the server
    while (leftovers := session_processes(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in leftovers:  # never leave a server behind, even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert not leftovers, f"serve left processes behind after SIGTERM: {leftovers}"


@contextlib.contextmanager
def running_server(*overrides, cwd, conf_dir=None, startup_s: float = 180, env=None):
    """Like `server_process`, yielding only the base URL."""
    with server_process(*overrides, cwd=cwd, conf_dir=conf_dir, startup_s=startup_s, env=env) as server:
        yield server.base


def child_pids(pid: int):
    """The process's children, whichever of its threads started them."""
    pids = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            pids += [int(child) for child in f.read().split()]
    return pids


def session_processes(session_id: int):
    """PIDs still alive in the server's session (it and every worker it started)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == session_id and not _zombie(int(entry)):
                    pids.append(int(entry))
            except ProcessLookupError:
                pass
    return pids


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
