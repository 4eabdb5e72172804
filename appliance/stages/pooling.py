"""Pooling's batching, the one place, for `appliance run` and `appliance serve`: each record's tensor is one
engine item; at most a window of items is in flight; records leave in the order they came, each with its
item's output. The engine groups the items it holds into forwards of up to `engine.max_batch_size`
(`PoolEngine.plan_batch`); this module decides when items go in and when records come out.

Items reach the engine through a port. Offline (`EngineSteps`) the engine stage steps its own engine: a
window of one batch, a forward whenever a batch's worth waits, then the tail. Served, a request's thread
posts its items to the engine loop, which steps one engine for every request (pool_driver.PoolSession): a
window of two batches (one running, one ready), so memory stays bounded.
"""
from collections import deque
from collections.abc import Iterator
from typing import Any, Protocol

from appliance.engine.geo_coords import COORDS_FIELD
from appliance.pipeline import Record

SERVED_BATCHES_IN_FLIGHT = 2  # a request's items in flight on the engine loop: one batch running, one ready


class ItemPort(Protocol):
    def submit(self, seq: int, item: Any, record: Record) -> None:
        """Hand item number `seq` (of `record`, which may say more: its coordinates, its tile) to the engine."""

    def collect(self, wait: bool) -> dict[int, Any]:
        """The outputs that are in, by item number; with `wait`, at least one (blocking or stepping for it)."""


def pool_in_order(records: Iterator[Record], port: ItemPort, input_field: str, output_field: str,
                  window: int) -> Iterator[Record]:
    """`records` with `output_field` added (the item's output) and `input_field` dropped, in order, with at
    most `window` items submitted and not yet collected."""
    pending: deque[tuple[int, Record]] = deque()  # in arrival order
    done: dict[int, Any] = {}
    for seq, record in enumerate(records):
        port.submit(seq, record[input_field], record)
        pending.append((seq, record))
        done.update(port.collect(wait=len(pending) - len(done) >= window))
        yield from release_in_order(pending, done, input_field, output_field)
    while pending:
        done.update(port.collect(wait=True))
        yield from release_in_order(pending, done, input_field, output_field)


def release_in_order(pending: deque[tuple[Any, Record]], outputs: dict[Any, Any], input_field: str,
                     output_field: str) -> Iterator[Record]:
    """Records leave in the order they came, each as soon as its own output and those of every record
    before it are in; the input tensor is dropped (done with: freed now) and the output added. `pending`:
    (key, record) in arrival order; `outputs`: key -> output."""
    while pending and pending[0][0] in outputs:
        key, record = pending.popleft()
        out = {k: v for k, v in record.items() if k != input_field}
        out[output_field] = outputs.pop(key)
        yield out


class EngineSteps:
    """The offline port: items go to the engine stage's engine, and collecting runs one engine step."""

    def __init__(self, stage):
        self.stage = stage
        self.seqs: dict[str, int] = {}  # engine request id -> item number

    def submit(self, seq: int, item: Any, record: Record) -> None:
        self.seqs[self.stage.add_item(item, record.get(COORDS_FIELD))] = seq

    def collect(self, wait: bool) -> dict[int, Any]:
        if not wait:
            return {}  # nothing runs between steps
        return {self.seqs.pop(out.request_id): out.output[0] for out in self.stage.step()}
