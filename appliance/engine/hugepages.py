"""Large CPU buffers backed by transparent huge pages.

A decode step streams every weight and every live K/V once: hundreds of MB in 4 KB pages miss the TLB
on every page. Where the kernel grants huge pages only on request (THP "madvise", the common default),
we ask for them before the buffer is first touched. Elsewhere (no THP, not Linux) this is a plain
allocation.
"""
import math
import mmap
from typing import Sequence

import torch

HUGE_PAGE = 2 * 1024 * 1024
MIN_BYTES = 8 * HUGE_PAGE  # below this the alignment slack is not worth it


def empty(shape: Sequence[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialised contiguous CPU tensor whose memory starts on a 2 MB boundary and is marked for
    huge pages (small tensors: a plain torch.empty)."""
    if _nbytes(shape, dtype) < MIN_BYTES:
        return torch.empty(tuple(shape), dtype=dtype)
    return _fresh_mapping(shape, dtype)


def zeros(shape: Sequence[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`empty`, reading as zeros, with no pass over it: the kernel zero-fills each page of a fresh
    anonymous mapping when it is first touched, so the pages a run never reaches (most of a KV pool,
    for one question) cost neither time nor memory (small tensors: a plain torch.zeros)."""
    if _nbytes(shape, dtype) < MIN_BYTES:
        return torch.zeros(tuple(shape), dtype=dtype)
    return _fresh_mapping(shape, dtype)


def _fresh_mapping(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    nbytes = _nbytes(shape, dtype)
    # A private anonymous mapping (shared ones follow the shmem THP setting, off by default): pages the
    # kernel has not handed out yet, so the advice comes first.
    memory = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = torch.frombuffer(memory, dtype=torch.uint8)  # shares the mapping and keeps it alive
    offset = -raw.data_ptr() % HUGE_PAGE
    advise_huge(memory, offset, nbytes)
    return raw[offset:offset + nbytes].view(dtype).view(tuple(shape))


def _nbytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    return math.prod(shape) * dtype.itemsize


def advise_huge(memory: mmap.mmap, start: int, length: int) -> None:
    """Ask for huge pages over memory[start:start + length]; a host that has none keeps 4 KB pages."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)  # Linux only
    if advice is not None:
        try:
            memory.madvise(advice, start, length)
        except OSError:  # THP compiled out: EINVAL
            pass
