"""The progress reporter (appliance/progress.py), driven by a fake clock: no sleeps, no wall-clock time."""
import io
import math
import re

import pytest

from appliance.errors import ConfigError
from appliance.progress import Progress, check_interval, duration, silence


class Clock:
    """A clock the test moves by hand."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Terminal(io.StringIO):
    def isatty(self):
        return True


def plain(total, unit="tile", **kwargs):
    stream, clock = io.StringIO(), Clock()
    return Progress(total, "scene.tif", unit, stream=stream, clock=clock, **kwargs), stream, clock


def test_plain_lines_come_once_per_interval_then_a_last_one_at_100_percent():
    progress, stream, clock = plain(10, interval=5.0)
    counts = []
    for _ in range(10):  # one tile a second
        clock.now += 1.0
        progress.update(1)
        counts.append(len(stream.getvalue().splitlines()))
    assert counts == [0, 0, 0, 0, 1, 1, 1, 1, 1, 2]  # at 5 s, then the last at 10 s
    assert stream.getvalue().splitlines() == [
        "scene.tif: 5/10 tiles (50%), 1.0 tiles/s, eta 5s",
        "scene.tif: 10/10 tiles (100%), 1.0 tiles/s, in 10s",
    ]


def test_plain_line_cadence_and_format():
    """A line at the first update at or after each interval; the next interval counts from that line."""
    progress, stream, clock = plain(100, interval=5.0)
    for t in [0.5, 4.9, 5.0, 6.0, 9.9, 11.0, 12.0, 15.9, 16.0]:
        clock.now = 100.0 + t
        progress.update(1)
    assert stream.getvalue().splitlines() == [
        "scene.tif: 3/100 tiles (3%), 0.6 tiles/s, eta 2m42s",  # at 5.0 s
        "scene.tif: 6/100 tiles (6%), 0.5 tiles/s, eta 2m52s",  # at 11.0 s, not 10 s: no update came then
        "scene.tif: 9/100 tiles (9%), 0.6 tiles/s, eta 2m42s",  # at 16.0 s: 5 s after the last line
    ]


def test_the_last_line_comes_with_the_update_that_reaches_the_total():
    progress, stream, clock = plain(3, interval=60.0)
    clock.now += 1.5
    progress.update(2)
    assert stream.getvalue() == ""
    clock.now += 1.5
    progress.update(1)
    assert stream.getvalue() == "scene.tif: 3/3 tiles (100%), 1.0 tiles/s, in 3s\n"
    assert progress.finished
    progress.update(1)  # late updates and a second close change nothing
    progress.close()
    assert stream.getvalue() == "scene.tif: 3/3 tiles (100%), 1.0 tiles/s, in 3s\n"


def test_answers_show_tokens_per_second_and_an_eta():
    progress, stream, clock = plain(300, unit="answer", rate_unit="token", interval=5.0)
    clock.now += 2.0
    progress.update(0, 40)  # tokens before any answer is done: no ETA yet
    clock.now += 3.0
    progress.update(0, 60)
    clock.now += 5.0
    progress.update(3, 100)
    assert stream.getvalue().splitlines() == [
        "scene.tif: 0/300 answers (0%), 20.0 tokens/s, eta ?",
        "scene.tif: 3/300 answers (1%), 20.0 tokens/s, eta 16m30s",
    ]


@pytest.mark.parametrize("total, unit, line", [
    (1, "tile", "scene.tif: 1/1 tile (100%), 1.0 tiles/s, in 1s"),
    (2, "tile", "scene.tif: 2/2 tiles (100%), 2.0 tiles/s, in 1s"),
    (1, "answer", "scene.tif: 1/1 answer (100%), 1.0 answers/s, in 1s"),
])
def test_a_count_of_one_is_singular(total, unit, line):
    progress, stream, clock = plain(total, unit=unit)
    clock.now += 1.0
    progress.update(total)
    assert stream.getvalue().splitlines() == [line]


def test_work_that_stops_short_gets_no_last_line():
    """An error ends the run: its one error line is what the user reads, not a progress line."""
    progress, stream, clock = plain(10, interval=5.0)
    clock.now += 1.0
    progress.update(4)
    progress.close()
    assert stream.getvalue() == ""


def test_disabled_shows_nothing_even_on_a_terminal():
    stream = Terminal()
    progress = Progress(3, "scene.tif", "tile", enabled=False, stream=stream, clock=Clock())
    assert progress.bar is None
    progress.update(3)
    progress.close()
    assert stream.getvalue() == ""


def test_terminal_bar_ends_at_100_percent_on_its_own_line():
    stream = Terminal()
    progress = Progress(81, "scene.tif", "tile", stream=stream, clock=Clock())
    for _ in range(73):
        progress.update(1)
    progress.update(8)  # the last batch of tiles lands at once (what once left the bar at 73/81)
    assert progress.finished  # closed by the last update, before anything else prints
    text = stream.getvalue()
    assert text.endswith("\n")  # the next output starts on a line of its own
    last = re.split(r"[\r\n]", text.rstrip("\n"))[-1]
    assert "scene.tif: 100%" in last and "81/81" in last, last


def test_terminal_bar_shows_tokens_per_second():
    stream, clock = Terminal(), Clock()
    progress = Progress(2, "requests.jsonl", "answer", rate_unit="token", stream=stream, clock=clock)
    clock.now += 2.0
    progress.update(1, 10)
    clock.now += 2.0
    progress.update(1, 10)
    last = re.split(r"[\r\n]", stream.getvalue().rstrip("\n"))[-1]
    assert "2/2" in last and "5.0 tokens/s" in last, last


@pytest.mark.parametrize("seconds, text", [
    (0, "0s"), (11.4, "11s"), (59.6, "1m00s"), (125, "2m05s"), (3599, "59m59s"), (7260, "2h01m"),
])
def test_duration(seconds, text):
    assert duration(seconds) == text


@pytest.mark.parametrize("interval", [0, -1, math.nan])
def test_interval_must_be_positive(interval):
    with pytest.raises(ConfigError, match=r"^stitch.progress_interval: .*allowed: a number of seconds above 0"):
        check_interval(interval, "stitch.progress_interval")


def test_silence_turns_off_the_stages_that_report():
    class Options:
        progress = True

    class Stage:
        def __init__(self, options):
            self.options = options

    reporting, other = Stage(Options()), Stage(object())
    silence([reporting, other])
    assert reporting.options.progress is False


def test_without_a_bar_a_terminal_gets_the_plain_lines_timed_from_the_given_start():
    """A region's scenes: each prints lines of its own, so plain lines, and the clock started with the run."""
    stream, clock = Terminal(), Clock()
    progress = Progress(3, "masks", "scene", interval=5.0, stream=stream, clock=clock, bar=False, start=90.0)
    assert progress.bar is None
    for _ in range(3):
        clock.now += 10.0
        progress.update()
    assert stream.getvalue().splitlines() == [
        "masks: 1/3 scenes (33%), 0.1 scenes/s, eta 40s",  # 20 s since the start, not 10
        "masks: 2/3 scenes (66%), 0.1 scenes/s, eta 15s",
        "masks: 3/3 scenes (100%), 0.1 scenes/s, in 40s",
    ]
