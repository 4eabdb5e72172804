"""Keep Python's garbage collector off the objects a process keeps until it exits, and off the objects
of requests that are still running.

A loaded engine holds hundreds of thousands of container objects (modules, tokenizer, config, the web
app). Left in the collector's oldest generation, each full collection walks all of them (a pause in the
engine loop), and the young collections that per-request garbage triggers cost more too. Frozen, they
are skipped; refcounting still frees any of them that is dropped. Done once per process, after
set-up (vLLM does the same after its warm-up): a library call would freeze the objects of every other
user of the process.

Young collections exist for cyclic garbage: a request's objects are freed by reference counting when it
ends, and what a request leaves in cycles is rare. At CPython's default threshold (a collection once 700
more objects were made than freed) the rise and fall of the objects of requests in flight set them off
every few requests under load, each walking those live objects: CPU in both server processes for every
request (docs/serving.md). At `YOUNG_THRESHOLD` they run once that many more objects were made than
freed: soon after a pile-up of cyclic garbage, each walking at most about that many objects.
"""
import gc

YOUNG_THRESHOLD = 10_000


def settle_heap() -> None:
    """Freeze what set-up made and collect the young generation less often."""
    gc.set_threshold(YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    gc.collect()  # what is garbage now would otherwise be frozen for good
    gc.freeze()
