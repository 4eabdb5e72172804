"""Progress of long offline work (the tiles of a scene, the scenes of a region, the answers of a chat batch),
on stderr.

On a terminal: a tqdm bar that ends at 100 % and stays on its own line, so whatever the run prints next
starts on a new line. Anywhere else (a pipe, a log file, a Kubernetes Job's log): one plain line every
`interval` seconds while the work runs, and a last one when it is done:

    flood_sample.tif: 48/81 tiles (59%), 3.1 tiles/s, eta 11s
    flood_sample.tif: 81/81 tiles (100%), 3.0 tiles/s, in 27s

The work is finished (bar closed, last line written) by the update that reaches the total, so a stage
that yields its results after that update cannot print its result before the bar ends. Work that stops
short (an error) gets no last line: the error is what the user reads next.
"""
import sys
import time
from typing import Callable, Iterable, Optional, TextIO

from appliance.errors import ConfigError
from appliance.words import counted, plural

DEFAULT_INTERVAL = 5.0  # seconds between plain lines when stderr is not a terminal


def check_interval(interval: float, where: str) -> None:
    """ConfigError naming `where` unless the interval is a positive number of seconds."""
    if not interval > 0:
        raise ConfigError(f"{where}: {interval}; allowed: a number of seconds above 0")


def silence(stages: Iterable) -> None:
    """Turn off the stages' progress (their `progress` option): it is for `appliance run`; a server runs
    many requests at once, and its log speaks of requests, not of each one's tiles."""
    for stage in stages:
        if hasattr(stage.options, "progress"):
            stage.options.progress = False


def duration(seconds: float) -> str:
    """`11s`, `2m05s`, `2h01m`: short enough for a log line, precise enough for an ETA."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """`done` of `total` units of work under `label`; `unit` names one of them ("tile"). `rate_unit`
    (e.g. "token"): the rate shown counts the `extra` units passed to `update` (tokens generated) rather
    than the units of work.
    `enabled=False`: shows nothing (a stage's `progress: false`). `bar=False`: plain lines on a terminal too,
    for work whose units print lines of their own (a region's scenes: each its tile bar and `wrote` line),
    which would break a bar. `start`: when the work began, on `clock` (default: now)."""

    def __init__(self, total: int, label: str, unit: str, rate_unit: Optional[str] = None,
                 interval: float = DEFAULT_INTERVAL, enabled: bool = True, stream: Optional[TextIO] = None,
                 clock: Callable[[], float] = time.monotonic, bar: bool = True, start: Optional[float] = None):
        self.total, self.label, self.unit, self.rate_unit = total, label, unit, rate_unit
        self.interval, self.clock = interval, clock
        self.stream = stream if stream is not None else sys.stderr
        self.done = self.extra = 0
        self.start = clock() if start is None else start
        self.next_line = self.start + interval
        self.finished = not enabled  # nothing to show, nothing to end
        self.bar = None
        if enabled and bar and self.stream.isatty():
            from tqdm import tqdm

            # leave=True: the bar stays, at its final count, on a line of its own.
            self.bar = tqdm(total=total, desc=label, unit=plural(unit), leave=True, file=self.stream)

    def update(self, done: int = 1, extra: int = 0) -> None:
        """`done` more units of work finished, `extra` more rate units (tokens) produced."""
        if self.finished:
            return
        self.done += done
        self.extra += extra
        if self.bar is not None:
            if self.rate_unit:
                rate = self._rate(self.clock() - self.start)
                self.bar.set_postfix_str(f"{rate:.1f} {plural(self.rate_unit)}/s", refresh=False)
            self.bar.update(done)
        elif self.done < self.total and self.clock() >= self.next_line:
            self._write(self.line())
            self.next_line = self.clock() + self.interval
        if self.done >= self.total:
            self.close()

    def close(self) -> None:
        """End the report: the bar closes where it stands; the last plain line only for finished work."""
        if self.finished:
            return
        self.finished = True
        if self.bar is not None:
            self.bar.close()
        elif self.done >= self.total:
            self._write(self.line())

    def line(self) -> str:
        """The plain line for the work so far: done, share, rate, then the ETA or, once done, the time taken."""
        elapsed = self.clock() - self.start
        share = 100 * self.done // self.total if self.total else 100
        rate_unit = self.rate_unit or self.unit
        head = (f"{self.label}: {self.done}/{counted(self.total, self.unit)} ({share}%), "
                f"{self._rate(elapsed):.1f} {plural(rate_unit)}/s")
        if self.done >= self.total:
            return f"{head}, in {duration(elapsed)}"
        if not self.done:
            return f"{head}, eta ?"
        return f"{head}, eta {duration(elapsed * (self.total - self.done) / self.done)}"

    def _rate(self, elapsed: float) -> float:
        return (self.extra if self.rate_unit else self.done) / max(elapsed, 1e-9)

    def _write(self, text: str) -> None:
        print(text, file=self.stream, flush=True)
