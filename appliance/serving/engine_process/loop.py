"""The engine loop: LitServe's inference worker (the engine process) runs it, one per server, and it never returns.

Each turn: hand the driver what arrived (new requests and aborts from the HTTP process, prepared
requests and tiles from its preparer threads), run one engine step if there is work, and send the turn's
events to the HTTP process as one message on the events pipe. A receiver thread moves what arrives on the
requests pipe into the driver's inbox, so the loop sleeps on one queue when idle and never waits on IPC
while the engine runs. (LitServe's own request queue and transport go unused: see server.py.)

The model loads here, not in `LitAPI.setup` (which LitServe awaits before it starts the HTTP server), so
the HTTP server answers /health while weights load and /ready turns 200 after the warm-up step.
"""
import _thread
import logging
import os
import signal
import threading
import traceback
from litserve.loops.base import LitLoop

from appliance.gc_tuning import settle_heap
from appliance.serving import pipes
from appliance.serving.engine_process.inbox import Arrived
from appliance.serving.messages import Failed
from appliance.serving.state import DEAD, READY
from appliance.serving.stop_signals import follow_parent

log = logging.getLogger(__name__)
IDLE_WAIT_S = 0.05  # how long an idle loop sleeps on its inbox (a new request wakes it at once)


class EngineLoop(LitLoop):
    def run(self, lit_api, device, worker_id, request_queue, transport, workers_setup_status, callback_runner):
        """LitServe's loop entry point. Jobs arrive on our requests pipe (`lit_api.requests`) and events
        leave on our events pipe, so LitServe's `request_queue` and `transport` go unused."""
        # Stop signals stay blocked here (stop_signals.py); when the main process stops the server, the
        # watcher raises SystemExit in this thread, which closes the engine (and its TP ranks).
        signal.signal(signal.SIGTERM, _exit)
        shared, driver = lit_api.shared, lit_api.driver
        follow_parent(lambda: _thread.interrupt_main(signal.SIGTERM), "engine", lambda: shared.stopping)
        try:
            for stage in driver.online.stages():
                stage.setup()
            driver.start()
            settle_heap()  # the model, tokenizer and warm-up state live as long as the loop
        except SystemExit:
            raise
        except BaseException:
            log.error("the engine could not start:\n%s", traceback.format_exc())
            shared.set_phase(DEAD)
            raise
        stopped = False
        try:
            self._serve(lit_api, driver)
        except SystemExit:  # the main process stops the server
            stopped = True
        finally:
            driver.close()
        if stopped:
            # Threads still preparing requests that the HTTP process already answered (a second stop
            # signal cuts them) would hold the interpreter's exit; the engine and its ranks are closed.
            logging.shutdown()
            os._exit(0)

    def _serve(self, lit_api, driver) -> None:
        shared, events = lit_api.shared, lit_api.events
        threading.Thread(target=self._receive, args=(lit_api.requests, driver), name="request-receiver",
                         daemon=True).start()
        shared.set_phase(READY)
        log.info("engine loop ready")
        try:
            while True:
                driver.drain_inbox(0 if driver.busy() else IDLE_WAIT_S)
                try:
                    driver.step()
                except Exception as e:  # fatal ones re-raised, the rest fail their requests
                    if is_fatal(e):
                        raise
                    log.exception("engine step failed; failing the requests it held")
                    driver.fail_stepping(Failed(500, f"the engine failed while running this request "
                                                f"({type(e).__name__}: {e}); the server goes on"))
                self._send(events, driver.take_events())
        except SystemExit:
            raise
        except BaseException as e:
            log.error("the engine loop stopped:\n%s", traceback.format_exc())
            shared.set_phase(DEAD)
            driver.fail_all(Failed(503, f"the engine stopped ({type(e).__name__}: {e}); the server is "
                                        "shutting down, retry on another replica"))
            self._send(events, driver.take_events())
            raise

    @staticmethod
    def _receive(requests, driver) -> None:
        while True:
            try:
                uid, arrival, message = pipes.receive(requests.fileno())
            except (EOFError, OSError):  # the server is shutting down
                return
            driver.post(Arrived(uid, message, arrival))

    @staticmethod
    def _send(events, batch) -> None:
        """The whole turn in one message: every request's events, routed by uid on the HTTP side."""
        if batch:
            pipes.send(events.fileno(), batch)


def _exit(signum, frame):
    raise SystemExit(0)


def is_fatal(error: BaseException) -> bool:
    """A tensor-parallel rank that died takes the engine with it; other step errors fail only requests."""
    from appliance.engine.tp_executor import RankDiedError

    return isinstance(error, RankDiedError)
