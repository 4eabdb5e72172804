"""hugepages.empty: 2 MB-aligned, huge-page-advised CPU buffers for the packed weights and the KV pool."""
import torch

from appliance.engine import hugepages


def test_large_buffers_start_on_a_huge_page_and_are_advised(monkeypatch):
    advised = []
    monkeypatch.setattr(hugepages, "_madvise_huge", lambda addr, length: advised.append((addr, length)))
    t = hugepages.empty((3, 5, 1024, 1024), torch.float32)  # 60 MB
    assert t.shape == (3, 5, 1024, 1024) and t.dtype == torch.float32 and t.is_contiguous()
    assert t.data_ptr() % hugepages.HUGE_PAGE == 0
    assert advised == [(t.data_ptr(), t.numel() * 4)]
    t.fill_(1.5)  # the whole range is ours to write
    assert float(t.sum()) == 1.5 * t.numel()


def test_small_buffers_are_plain(monkeypatch):
    advised = []
    monkeypatch.setattr(hugepages, "_madvise_huge", lambda addr, length: advised.append(addr))
    t = hugepages.empty((16, 16), torch.bfloat16)
    assert t.shape == (16, 16) and t.dtype == torch.bfloat16 and not advised
