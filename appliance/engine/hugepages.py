"""Large CPU buffers backed by transparent huge pages.

A decode step streams every weight and every live K/V once: hundreds of MB in 4 KB pages miss the TLB
on every page. Where the kernel grants huge pages only on request (THP "madvise", the common default),
we ask for them before the buffer is first touched. Elsewhere (no THP, not Linux, a GPU tensor) this is
a plain allocation.
"""
import ctypes
import ctypes.util
from typing import Optional, Sequence

import torch

HUGE_PAGE = 2 * 1024 * 1024
MADV_HUGEPAGE = 14
MIN_BYTES = 8 * HUGE_PAGE  # below this the alignment slack is not worth it

_libc: Optional[ctypes.CDLL] = None


def _madvise_huge(addr: int, length: int) -> None:
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
            _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _libc.madvise(addr, length, MADV_HUGEPAGE)  # a refusal (no THP) just leaves 4 KB pages
    except (OSError, AttributeError, TypeError):
        pass


def empty(shape: Sequence[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialised contiguous CPU tensor whose memory starts on a 2 MB boundary and is marked for
    huge pages (small tensors: a plain torch.empty)."""
    numel = 1
    for n in shape:
        numel *= n
    elem = torch.empty((), dtype=dtype).element_size()
    if numel * elem < MIN_BYTES:
        return torch.empty(tuple(shape), dtype=dtype)
    raw = torch.empty(numel * elem + HUGE_PAGE, dtype=torch.uint8)  # not yet touched: mmap-backed
    offset = -raw.data_ptr() % HUGE_PAGE
    _madvise_huge(raw.data_ptr() + offset, numel * elem)
    # The view keeps `raw` alive through its storage.
    return raw[offset:offset + numel * elem].view(dtype).view(tuple(shape))
