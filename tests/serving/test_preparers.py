"""How the engine loop's preparers take requests: each prepares every request waiting when it looks and
hands them over together; no more preparers run than `server.preprocess_workers`; a request aborted
before its turn is not prepared. The preparing itself is replaced by a recorder here (the server tests
run the real one)."""
import os
import threading
import time
from types import SimpleNamespace

from appliance.serving.engine_process.generate_driver import GenerateDriver
from appliance.serving.engine_process.inbox import Prepared
from tests.conftest import assert_user_error, run_cli


class RecordingDriver(GenerateDriver):
    """The generate worker's admission and preparers, with `_prepare_group` recording instead of
    preparing; the first group blocks until released, so requests pile up behind it."""

    def __init__(self, workers: int):
        cfg = SimpleNamespace(server=SimpleNamespace(preprocess_workers=workers))
        super().__init__(cfg, online=None, metrics=None, shared=None)
        self.sessions = {}  # start() makes it, with the engine
        self.release, self.lock = threading.Event(), threading.Lock()
        self.prepared_by = {}  # uid -> preparing thread
        self.groups = []  # the uids of each group prepared

    def _prepare_group(self, group):
        with self.lock:
            for uid, _ in group:
                self.prepared_by[uid] = threading.current_thread().name
            self.groups.append([uid for uid, _ in group])
        self.release.wait(30)
        return [Prepared(uid, [([1, 2, 3], None)]) for uid, _ in group]

    def posted(self):
        items = []
        while not self.inbox.empty():
            items.append(self.inbox.get())
        return [(type(message).__name__, message.uid) for message in items]


def admit(worker, uid):
    worker.admit(uid, 0.0, SimpleNamespace(request=SimpleNamespace()))


def wait_until(condition, seconds=10):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_one_preparer_takes_every_request_waiting_and_hands_them_over_together():
    worker = RecordingDriver(workers=1)
    admit(worker, "a")  # the preparer starts on it and blocks
    wait_until(lambda: "a" in worker.prepared_by)
    for uid in "bcd":
        admit(worker, uid)
    assert worker.active_preparers == 1 and [uid for uid, _ in worker.unprepared] == ["b", "c", "d"]
    worker.release.set()
    worker.executor.shutdown(wait=True)
    assert worker.posted() == [("Prepared", uid) for uid in "abcd"]
    assert worker.groups == [["a"], ["b", "c", "d"]]  # prepared as one group
    assert len(set(worker.prepared_by.values())) == 1 and worker.active_preparers == 0


def test_no_more_preparers_than_workers_and_aborted_requests_are_skipped():
    worker = RecordingDriver(workers=2)
    admit(worker, "a")
    admit(worker, "b")  # two preparers, both blocked
    wait_until(lambda: len(worker.prepared_by) == 2)
    admit(worker, "c")
    admit(worker, "d")
    assert worker.active_preparers == 2
    del worker.sessions["c"]  # aborted while waiting
    worker.release.set()
    worker.executor.shutdown(wait=True)
    assert sorted(uid for _, uid in worker.posted()) == ["a", "b", "d"]
    assert "c" not in worker.prepared_by and worker.active_preparers == 0


def test_preprocess_workers_default():
    assert RecordingDriver(workers=0).preparer_threads == min(4, len(os.sched_getaffinity(0)))
    assert RecordingDriver(workers=3).preparer_threads == 3


def test_a_negative_preprocess_workers_is_a_cli_error():
    result = run_cli("serve", "pipeline=llava_chat", "server.preprocess_workers=-1")
    assert_user_error(result, "server.preprocess_workers: -1; allowed: 0")


def test_every_inbox_message_has_one_handler_in_the_worker_kinds_that_receive_it():
    """The dispatch table, checked: each message type maps to a method of the worker that handles it."""
    from appliance.serving.engine_process import inbox
    from appliance.serving.engine_process.plain_driver import PlainDriver
    from appliance.serving.engine_process.pool_driver import PoolDriver

    cfg = SimpleNamespace(server=SimpleNamespace(preprocess_workers=1))
    kinds = {kind: kind(cfg, online=None, metrics=None, shared=None).message_handlers()
             for kind in (GenerateDriver, PoolDriver, PlainDriver)}
    expected = {GenerateDriver: {inbox.Arrived, inbox.Unanswerable, inbox.Prepared, inbox.Tokenized},
                PoolDriver: {inbox.Arrived, inbox.Unanswerable, inbox.TileReady, inbox.Finished},
                PlainDriver: {inbox.Arrived, inbox.Unanswerable, inbox.Finished}}
    for kind, handlers in kinds.items():
        assert set(handlers) == expected[kind], kind
        assert all(handler.__self__.__class__ is kind for handler in handlers.values())
    messages = {value for value in vars(inbox).values()
                if isinstance(value, type) and value.__module__ == inbox.__name__}
    assert messages == set().union(*expected.values())  # no message nobody handles
