"""`freeze_startup_heap`: what a process holds after set-up leaves the collector's reach; its garbage does not."""
import subprocess
import sys
import textwrap

from tests.conftest import REPO

PROBE = textwrap.dedent("""
    import gc, weakref
    from appliance.heap import freeze_startup_heap

    class Node:
        pass

    kept = [Node() for _ in range(1000)]          # what set-up loaded
    cycle = Node(); cycle.me = cycle              # garbage only the collector can free
    gone = weakref.ref(cycle); del cycle
    gc.disable()                                  # nothing but the freeze may collect it
    before = gc.get_freeze_count()
    freeze_startup_heap()
    print(gone() is None, gc.get_freeze_count() - before >= len(kept), gc.get_count()[0])
""")


def test_the_heap_is_frozen_and_its_garbage_collected_first():
    # In a child process: freezing this test process would keep every later test's objects.
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO, check=True)
    collected, frozen, young = out.stdout.split()
    assert collected == "True" and frozen == "True" and young == "0", out.stdout
