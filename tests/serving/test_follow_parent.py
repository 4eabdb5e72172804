"""A child that follows its parent's stop (appliance/serving/stop_signals.py), as the HTTP and engine
processes do, in a real process family: this test process plays "someone else" (a SIGTERM to the whole
group or cgroup), a parent process plays the main process (it marks the server stopping, then sends its
SIGTERM), and the child reports what it did.

Linux keeps one SIGTERM pending per process, with the first sender's pid. When the child's watcher starts
only after both SIGTERMs were sent, the parent's is merged into the other one every time: the race a busy
machine loses now and then (the watcher not scheduled between the two) happens deterministically.
"""
import logging
import multiprocessing as mp
import os
import signal
import threading
from queue import Empty

import pytest

from appliance.serving import stop_signals
from appliance.serving.state import SharedState
from appliance.serving.stop_signals import STOP_SIGNALS, follow_parent

LIMIT_S = 30  # how long any process of the family waits for the next step before giving up
FORK = mp.get_context("fork")


class ReportDropped(logging.Handler):
    """In the child: a signal the watcher dropped (it logs that at DEBUG) becomes a report."""

    def __init__(self, reports):
        super().__init__(logging.DEBUG)
        self.reports = reports

    def emit(self, record):
        if "left to the main process" in record.getMessage():
            self.reports.put(("dropped",))


def child(shared, watch, reports):
    """Stop signals blocked (inherited from the parent); follows the parent once told to watch."""
    logger = logging.getLogger(stop_signals.__name__)
    logger.setLevel(logging.DEBUG)
    logger.addHandler(ReportDropped(reports))
    if not watch.wait(LIMIT_S):
        return
    stopped = threading.Event()

    def on_stop():
        reports.put(("stopped", shared.stopping))
        stopped.set()

    follow_parent(on_stop, "test", lambda: shared.stopping)
    stopped.wait(LIMIT_S)


def parent(shared, watch, stop_child, sent, reports):
    """As the main process: its children start with the stop signals blocked; it stops the child as
    `Supervisor.stop` and LitServe do (mark the server stopping, then SIGTERM)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    kid = FORK.Process(target=child, args=(shared, watch, reports))
    kid.start()
    reports.put(("child", kid.pid))
    if stop_child.wait(LIMIT_S):
        shared.mark_stopping()
        os.kill(kid.pid, signal.SIGTERM)
        sent.set()
    kid.join(LIMIT_S)
    if kid.is_alive():
        kid.kill()
        kid.join()


class Family:
    """The parent and its child, started; the test says when the child starts watching and when the parent
    stops it, and reads the child's reports in order."""

    def __init__(self):
        self.shared = SharedState()
        self.watch, self.stop_child, self.sent = FORK.Event(), FORK.Event(), FORK.Event()
        self.reports = FORK.Queue()
        self.parent = FORK.Process(target=parent,
                                   args=(self.shared, self.watch, self.stop_child, self.sent, self.reports))
        self.parent.start()
        self.child_pid = self.expect("child")[1]

    def expect(self, kind):
        try:
            report = self.reports.get(timeout=LIMIT_S)
        except Empty:
            pytest.fail(f"the family never reported {kind!r}")
        assert report[0] == kind, report
        return report

    def parent_stops_child(self):
        self.stop_child.set()
        assert self.sent.wait(LIMIT_S), "the parent never sent its SIGTERM"

    def someone_else_sends_sigterm(self):
        os.kill(self.child_pid, signal.SIGTERM)  # blocked there: pending until its watcher takes it

    def close(self):
        self.watch.set()
        self.stop_child.set()
        self.parent.join(3 * LIMIT_S)


@pytest.fixture
def family():
    family = Family()
    yield family
    family.close()


def test_the_parents_sigterm_stops_the_child(family):
    family.parent_stops_child()
    family.watch.set()
    assert family.expect("stopped") == ("stopped", True)


def test_the_parents_sigterm_merged_into_anothers_still_stops_the_child(family):
    family.someone_else_sends_sigterm()
    family.parent_stops_child()  # while the other SIGTERM is pending: the child sees one, the other's
    family.watch.set()
    assert family.expect("stopped") == ("stopped", True)


def test_anothers_sigterm_before_the_parent_stops_is_dropped(family):
    family.watch.set()
    family.someone_else_sends_sigterm()
    family.expect("dropped")  # not stopped: the main process alone decides
    family.parent_stops_child()
    assert family.expect("stopped") == ("stopped", True)
