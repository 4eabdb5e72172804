"""The engine loop's side of the server: requests in, engine steps, events out.

A `Driver` (one kind per pipeline kind: generate_driver.py, pool_driver.py, plain_driver.py) owns the
engine (through the pipeline's `engine` stage), the online stages around it and the preparer threads
that prepare requests (fetch, decode, template, tile) so that no engine step waits for one. Everything
that touches the engine runs on the loop's thread; preparer threads talk to it only through `post` (the
inbox: inbox.py's messages, each handled by the method `message_handlers()` names), and the loop answers
clients only through `emit` (events, sent once per turn).
"""
import logging
import queue
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Tuple

from appliance.errors import ConfigError, InputError, UserError
from appliance.serving.engine_process.inbox import Arrived, Unanswerable
from appliance.serving.messages import Abort, Failed
from appliance.serving.metrics import EngineMetrics
from appliance.serving.online_stages import OnlinePipeline
from appliance.serving.state import SharedState

log = logging.getLogger(__name__)


class Driver:
    def __init__(self, cfg, online: OnlinePipeline, metrics: EngineMetrics, shared: SharedState):
        self.cfg = cfg
        self.online = online
        self.metrics = metrics
        self.shared = shared
        self.inbox: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self.handlers = self.message_handlers()
        # server.serve checked it
        self.preparer_threads = cfg.server.preprocess_workers or self.default_preparer_threads()
        self.executor = ThreadPoolExecutor(self.preparer_threads, thread_name_prefix="prepare")
        self.events: List[Tuple[str, Any]] = []

    # ---- plumbing -------------------------------------------------------------------------------
    def post(self, message: Any) -> None:
        """Thread-safe: hand the loop one of inbox.py's messages, handled on its thread."""
        self.inbox.put(message)

    def message_handlers(self) -> Dict[type, Callable[[Any], None]]:
        """Which method handles each message type this driver receives; a driver kind adds its own."""
        return {Arrived: self.on_arrived, Unanswerable: self.on_unanswerable}

    def emit(self, uid: str, event: Any) -> None:
        self.events.append((uid, event))

    def take_events(self) -> List[Tuple[str, Any]]:
        events, self.events = self.events, []
        return events

    def drain_inbox(self, timeout: float) -> None:
        """Handle everything posted; wait up to `timeout` for the first message when there is none."""
        try:
            message = self.inbox.get(timeout=timeout) if timeout > 0 else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            try:
                self.handlers[type(message)](message)
            except Exception as e:  # noqa: BLE001 - a bug with one request must not stop the engine
                self.emit(message.uid, self.failure(e, f"handling {type(message).__name__}"))
            try:
                message = self.inbox.get_nowait()
            except queue.Empty:
                return

    def on_arrived(self, message: Arrived) -> None:
        if isinstance(message.message, Abort):
            self.abort(message.uid)
        else:
            self.admit(message.uid, message.arrival, message.message)

    def on_unanswerable(self, message: Unanswerable) -> None:
        self.fail(message.uid, message.failure)

    def fail(self, uid: str, failure: Failed) -> None:
        if self.forget(uid):
            self.emit(uid, failure)

    def failure(self, error: BaseException, where: str) -> Failed:
        """The event for an exception raised while preparing or running a request."""
        if isinstance(error, InputError):
            return Failed(error.status, str(error), error.param)
        if isinstance(error, ConfigError):  # the server's config cannot serve this request
            return Failed(500, f"server configuration: {error}")
        if isinstance(error, UserError):
            return Failed(400, str(error), error.param)
        log.exception("request failed while %s", where)
        return Failed(500, f"internal error while {where} ({type(error).__name__}); see the server log")

    # ---- what a driver kind defines -------------------------------------------------------------
    def default_preparer_threads(self) -> int:
        """Preparer threads when `server.preprocess_workers` is 0. Four: a GeoTIFF request's thread waits
        for its tiles most of the time, and concurrent requests' tiles should share engine batches."""
        return 4

    def start(self) -> None:
        """Load, warm up; the server reports ready after this returns."""

    def admit(self, uid: str, arrival: float, job: Any) -> None:
        raise NotImplementedError

    def abort(self, uid: str) -> None:
        raise NotImplementedError

    def forget(self, uid: str) -> bool:
        """Drop the request's state; False when it was already gone (aborted or answered)."""
        raise NotImplementedError

    def busy(self) -> bool:
        """The engine has work: the loop must not sleep."""
        return False

    def step(self) -> None:
        """One engine step, if there is work."""

    def fail_all(self, failure: Failed) -> None:
        """The engine cannot go on: answer everything in flight."""

    def fail_stepping(self, failure: Failed) -> None:
        """An engine step raised: answer the requests the engine held (their state in it is lost);
        requests still being prepared go on."""
        self.fail_all(failure)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        for stage in reversed(self.online.stages()):
            stage.close()

