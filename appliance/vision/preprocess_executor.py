"""Run image loading and preprocessing off the engine loop, in a thread or process pool.

Pillow's resize and decode and torch's kernels release the GIL, so the event loop keeps running while
a thread resizes, and threads need no pickling or worker start-up; "thread" is the default.
`benchmarks/image_preprocess.py` measures both (docs/vision.md): on this project's 2 shared cores the
thread pool matched or beat the process pool, and neither beat inline throughput while other jobs held
the cores. A process pool needs a picklable, module-level function
and picklable arguments (PIL images, configs and tensors are).

    pool = PreprocessExecutor(workers=2)
    tensor = await pool.run(clip_preprocess, image, cfg)        # from asyncio: the loop stays free
    future = pool.submit(anyres_preprocess, image, cfg)         # from threads: a concurrent Future
    pool.close()

A `UserError` raised in a worker (a bad image) comes back unchanged to the caller of `run`/`result()`.
"""
from __future__ import annotations

import asyncio
import concurrent.futures as cf
import multiprocessing
import os
from typing import Any, Callable, Optional, TypeVar

from appliance.errors import ConfigError

T = TypeVar("T")


def _init_worker(torch_threads: int) -> None:
    import torch

    torch.set_num_threads(torch_threads)


class PreprocessExecutor:
    """A small executor wrapper; one per server, shared by all requests (it holds no request state)."""

    def __init__(self, workers: Optional[int] = None, kind: str = "thread", torch_threads: int = 1):
        if kind not in ("thread", "process"):
            raise ConfigError(f"vision pool kind = {kind!r}; allowed: thread, process")
        workers = workers or min(4, os.cpu_count() or 1)
        if workers < 1:
            raise ConfigError(f"vision pool workers = {workers}; allowed: 1 or more")
        self.kind, self.workers = kind, workers
        if kind == "thread":
            self._executor: cf.Executor = cf.ThreadPoolExecutor(workers, thread_name_prefix="vision")
        else:  # spawn: no forked copies of the engine's threads or CUDA state
            self._executor = cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                                    initializer=_init_worker, initargs=(torch_threads,))

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> "cf.Future[T]":
        return self._executor.submit(fn, *args, **kwargs)

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Await `fn(*args)` in the pool without blocking the event loop."""
        return await asyncio.wrap_future(self.submit(fn, *args, **kwargs))

    def map(self, fn: Callable[..., T], *iterables: Any) -> list[T]:
        return list(self._executor.map(fn, *iterables))

    def close(self, wait: bool = True) -> None:
        self._executor.shutdown(wait=wait, cancel_futures=not wait)

    def __enter__(self) -> "PreprocessExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
