"""Pooling's batching (stages/pooling.py), the rule `appliance run` and `serve` share: at most a window of
items in flight, records out in arrival order as soon as their outputs (and all before) are in."""
import pytest

from appliance.stages.pooling import pool_in_order


class ScriptedPort:
    """Collecting with `wait` finishes the `batch` oldest items in flight, handing their outputs back in
    `order` (reversed: the last first, as a served loop may); the log says what happened when."""

    def __init__(self, batch: int, reverse: bool = False):
        self.batch, self.reverse = batch, reverse
        self.in_flight, self.log, self.most = [], [], 0

    def submit(self, seq, item, record):
        assert item == f"tile{seq}" and record["tensor"] == item
        self.in_flight.append(seq)
        self.most = max(self.most, len(self.in_flight))
        self.log.append(f"+{seq}")

    def collect(self, wait):
        if not wait:
            return {}
        done, self.in_flight = self.in_flight[:self.batch], self.in_flight[self.batch:]
        self.log.append(f"step{done}")
        return {seq: f"out{seq}" for seq in (reversed(done) if self.reverse else done)}


def records(n, log):
    for i in range(n):
        log.append(f"read{i}")
        yield {"tensor": f"tile{i}", "key": i}


@pytest.mark.parametrize("n, batch, window, reverse, steps", [
    (7, 3, 3, False, [[0, 1, 2], [3, 4, 5], [6]]),  # offline: a forward whenever a batch waits, then the tail
    (7, 3, 6, False, [[0, 1, 2], [3, 4, 5], [6]]),  # served: two batches in flight
    (5, 2, 4, True, [[0, 1], [2, 3], [4]]),  # outputs handed back out of order still leave in order
    (2, 4, 8, False, [[0, 1]]),  # fewer items than a batch: one forward at the end
    (0, 4, 4, False, []),
])
def test_records_leave_in_order_with_at_most_a_window_in_flight(n, batch, window, reverse, steps):
    port, log = ScriptedPort(batch, reverse), []
    out = []
    for record in pool_in_order(records(n, log), port, "tensor", "logits", window):
        log.append(f"out{record['key']}")
        out.append(record)
    assert out == [{"key": i, "logits": f"out{i}"} for i in range(n)]  # the input dropped, the output added
    assert [entry for entry in port.log if entry.startswith("step")] == [f"step{s}" for s in steps]
    assert port.most <= window and not port.in_flight


def test_a_record_leaves_before_later_ones_are_read():
    """Streaming: the first batch's records come out before the records after the window are read."""
    port, log = ScriptedPort(batch=2), []
    for record in pool_in_order(records(6, log), port, "tensor", "logits", window=2):
        log.append(f"out{record['key']}")
    assert log.index("out0") < log.index("read2") and log.index("out2") < log.index("read4")
