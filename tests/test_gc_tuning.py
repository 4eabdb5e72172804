"""`settle_heap`: what a process holds after set-up leaves the collector's reach; its garbage does not."""
import subprocess
import sys
import textwrap

from tests.conftest import REPO

PROBE = textwrap.dedent("""
    import gc, weakref
    from appliance.gc_tuning import settle_heap

    class Node:
        pass

    kept = [Node() for _ in range(1000)]          # what set-up loaded
    cycle = Node(); cycle.me = cycle              # garbage only the collector can free
    gone = weakref.ref(cycle); del cycle
    gc.disable()                                  # nothing but the freeze may collect it
    before = gc.get_freeze_count()
    settle_heap()
    print(gone() is None, gc.get_freeze_count() - before >= len(kept), gc.get_count()[0])
""")


def test_the_heap_is_frozen_and_its_garbage_collected_first():
    # In a child process: freezing this test process would keep every later test's objects.
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO, check=True)
    collected, frozen, young = out.stdout.split()
    assert collected == "True" and frozen == "True" and young == "0", out.stdout


CHURN = textwrap.dedent("""
    import gc, weakref
    from appliance.gc_tuning import YOUNG_THRESHOLD, settle_heap

    class Node:
        pass

    settle_heap()
    young = lambda: gc.get_stats()[0]["collections"]
    before = young()
    for _ in range(50):                           # requests come and go: thousands of objects live at once
        in_flight = [[Node()] for _ in range(3000)]
        del in_flight
    churned = young() - before
    first = Node(); first.me = first              # then requests that leave cycles behind
    gone = weakref.ref(first); del first
    for _ in range(3 * YOUNG_THRESHOLD):
        node = Node(); node.me = node
    print(churned, gone() is None)
""")


def test_requests_objects_freed_by_refcounting_trigger_no_collection_but_cycles_still_do():
    out = subprocess.run([sys.executable, "-c", CHURN], capture_output=True, text=True, cwd=REPO, check=True)
    churned, cycles_collected = out.stdout.split()
    assert churned == "0", f"{churned} young collections while objects were only made and freed"
    assert cycles_collected == "True", out.stdout
