"""hugepages.empty and .zeros: 2 MB-aligned, huge-page-advised CPU buffers for the packed weights and the KV
pool."""
import re
from pathlib import Path

import pytest
import torch

from appliance.engine import hugepages
from tests.engine.helpers import resident_bytes

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
PAGEMAP = Path("/proc/self/pagemap")


def test_large_buffers_start_on_a_huge_page_and_are_advised(monkeypatch):
    advised = []
    monkeypatch.setattr(hugepages, "advise_huge", lambda memory, start, length: advised.append((start, length)))
    t = hugepages.empty((3, 5, 1024, 1024), torch.float32)  # 60 MB
    assert t.shape == (3, 5, 1024, 1024) and t.dtype == torch.float32 and t.is_contiguous()
    assert t.data_ptr() % hugepages.HUGE_PAGE == 0
    assert len(advised) == 1 and advised[0][0] < hugepages.HUGE_PAGE and advised[0][1] == t.numel() * 4
    t.fill_(1.5)  # the whole range is ours to write
    assert float(t.sum()) == 1.5 * t.numel()


def test_small_buffers_are_plain(monkeypatch):
    advised = []
    monkeypatch.setattr(hugepages, "advise_huge", lambda *args: advised.append(args))
    t = hugepages.empty((16, 16), torch.bfloat16)
    assert t.shape == (16, 16) and t.dtype == torch.bfloat16 and not advised


def test_the_buffer_outlives_every_name_but_the_tensor():
    t = hugepages.empty((4, 1024, 1024), torch.float32)
    t.fill_(2.0)
    view = t[1:3]
    del t
    assert float(view.sum()) == 2.0 * view.numel()


@pytest.mark.skipif(not PAGEMAP.exists(), reason="needs /proc/self/pagemap")
def test_large_zeros_are_not_touched_until_written():
    t = hugepages.zeros((64, 1024, 1024), torch.float32)  # 256 MB, as a KV pool one question barely uses
    assert t.shape == (64, 1024, 1024) and t.dtype == torch.float32 and t.is_contiguous()
    assert t.data_ptr() % hugepages.HUGE_PAGE == 0
    assert resident_bytes(t.data_ptr(), t.nbytes) == 0  # no pass over it: no page is backed yet
    t[7].fill_(3.0)  # what a run writes becomes resident, and only that
    assert resident_bytes(t.data_ptr(), t.nbytes) == t[7].nbytes
    assert float(t[7].min()) == 3.0 and not t[:7].any() and not t[8:].any()


def test_small_zeros_are_zero_even_in_reused_memory():
    torch.full((16, 16), 7.0, dtype=torch.bfloat16)  # freed at once: the allocator may hand it out next
    t = hugepages.zeros((16, 16), torch.bfloat16)
    assert t.shape == (16, 16) and t.dtype == torch.bfloat16 and not t.any()


@pytest.mark.skipif(not THP.exists() or "[never]" in THP.read_text(), reason="the kernel grants no huge pages")
def test_a_written_buffer_lies_in_huge_pages():
    t = hugepages.empty((8, 1024, 1024), torch.float32)  # 32 MB
    t.fill_(1.0)
    start = t.data_ptr()
    huge_kb, region = 0, None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if head:
            region = (int(head.group(1), 16), int(head.group(2), 16))
        elif line.startswith("AnonHugePages:") and region[0] <= start < region[1]:
            huge_kb = int(line.split()[1])
    assert huge_kb >= 16 * 1024, huge_kb
