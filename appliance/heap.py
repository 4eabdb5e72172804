"""Keep Python's garbage collector off the objects a process keeps until it exits.

A loaded engine holds ~400k container objects (modules, tokenizer, config, the web app). Left in the
collector's oldest generation, each full collection walks all of them (185 ms at once in the tiny
LLaVA's engine loop), and the young collections that per-request garbage triggers cost more too. Frozen,
they are skipped; refcounting still frees any of them that is dropped. Done once per process, after
set-up (vLLM does the same after its warm-up): a library call would freeze the objects of every other
user of the process.
"""
import gc


def freeze_startup_heap() -> None:
    gc.collect()  # what is garbage now would otherwise be frozen for good
    gc.freeze()
