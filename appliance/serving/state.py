"""What the server's processes share: a handful of counters in shared memory, no locks on hot paths.

Made by `appliance serve` in the main process before LitServe starts its processes, and handed to them
inside the LitAPI and the spec (multiprocessing values travel only that way, by inheritance):
  - the engine loop (inference worker) writes `phase` and `running`;
  - the HTTP process writes `inflight` and `listening` (once it answered a request), and reads the rest
    (/health, /ready, 429 decisions);
  - the main process writes `draining` on a stop signal, waits for `inflight` to reach 0, reads
    `listening` to know that the process clients reach on its address is its own, writes `stopping`
    before it stops the other processes (they read it when a stop signal arrives: stop_signals.py), and
    writes `phase` = DEAD once the engine loop has stopped or its process is gone (the loop writes no more).
"""
import multiprocessing as mp

STARTING, READY, DEAD = 0, 1, 2


class SharedState:
    def __init__(self, ctx=None):
        ctx = ctx or mp.get_context("spawn")
        self._phase = ctx.Value("i", STARTING, lock=False)
        self._running = ctx.Value("i", 0, lock=False)     # requests the engine is working on
        self._inflight = ctx.Value("i", 0, lock=False)    # requests the HTTP process accepted, not yet answered
        self._draining = ctx.Value("b", False, lock=False)
        self._listening = ctx.Value("b", False, lock=False)
        self._stopping = ctx.Value("b", False, lock=False)

    # One writer per field at a time (see the docstring), each value an aligned int written whole: plain
    # reads and writes suffice.
    @property
    def phase(self) -> int:
        return self._phase.value

    def set_phase(self, phase: int) -> None:
        self._phase.value = phase

    @property
    def running(self) -> int:
        return self._running.value

    def set_running(self, count: int) -> None:
        self._running.value = count

    @property
    def inflight(self) -> int:
        return self._inflight.value

    def set_inflight(self, count: int) -> None:
        self._inflight.value = count

    @property
    def draining(self) -> bool:
        return bool(self._draining.value)

    def start_draining(self) -> None:
        self._draining.value = True

    @property
    def listening(self) -> bool:
        return bool(self._listening.value)

    def mark_listening(self) -> None:
        self._listening.value = True

    @property
    def stopping(self) -> bool:
        return bool(self._stopping.value)

    def mark_stopping(self) -> None:
        self._stopping.value = True
