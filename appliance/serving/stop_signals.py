"""Stop signals: the main process decides, its children follow it (docs/serving.md, "Stopping").

A server gets SIGTERM or SIGINT in three ways: the main process alone (Kubernetes, `docker stop`), its
whole process group (a terminal's Ctrl-C, supervisord's `stopasgroup`, `timeout`), or every process of
its cgroup (systemd's default `KillMode=control-group`). All three must drain the same way, so only the
main process acts on what it receives. Every process it starts (LitServe's manager, the HTTP process,
the engine process, and theirs: tensor-parallel ranks, preprocess workers) starts with both signals
blocked, inherited from the thread that starts them, and keeps them blocked. The two that must stop when
the main process says so (HTTP, engine) wait for them on a thread and act on a SIGTERM their parent
sent (how LitServe stops its processes), or on anyone's SIGTERM once the main process marked the server
stopping (`SharedState.stopping`, set before it stops them); any other delivery is dropped. Linux keeps at
most one SIGTERM pending per process, with its first sender's pid: the parent's SIGTERM that arrives
while another sender's is still pending (a second SIGTERM to the whole group, on a busy machine) is
merged into it and reads as theirs.
"""
import logging
import os
import signal
import threading
from multiprocessing import resource_tracker
from typing import Callable

log = logging.getLogger(__name__)
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


def start_deaf_thread(target: Callable[[], None], name: str) -> threading.Thread:
    """Start `target` on a thread with the stop signals blocked: every process it starts inherits that.

    The calling thread keeps its own mask, so the main thread still receives the signals."""
    # Started later, from that thread, the resource tracker would unblock them there (multiprocessing
    # unblocks the calling thread after launching it).
    resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        thread = threading.Thread(target=target, name=name)
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return thread


def follow_parent(on_stop: Callable[[], object], process: str, parent_stopping: Callable[[], bool]) -> None:
    """In a child started with the stop signals blocked: call `on_stop()` (on a watcher thread) when the
    parent sends SIGTERM, or anyone does once `parent_stopping()` is true (the parent's may have been merged
    into theirs: see above); other signals are dropped."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            received = signal.sigwaitinfo(STOP_SIGNALS)
            if received.si_signo == signal.SIGTERM and (received.si_pid == parent or parent_stopping()):
                on_stop()
                return
            log.debug("%s process: %s from pid %d left to the main process", process,
                      signal.Signals(received.si_signo).name, received.si_pid)

    threading.Thread(target=watch, name="stop-signal-watcher", daemon=True).start()
