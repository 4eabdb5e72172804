"""Table-driven tests of KV block allocation, reference counts and the prefix cache."""
import pytest

from appliance.engine.block_manager import BlockManager, block_extra_keys, hash_block
from appliance.engine.sampling_params import SamplingParams
from appliance.engine.sequence import Sequence

BS = 4


def seq(tokens, rid="r", mm=None):
    return Sequence(rid, list(tokens), SamplingParams(), 0, mm_ranges=mm)


@pytest.mark.parametrize("num_blocks,num_tokens,ok,blocks_used", [
    (4, 1, True, 1),
    (4, 4, True, 1),
    (4, 5, True, 2),
    (4, 16, True, 4),
    (4, 17, False, 0),  # needs 5 blocks: refused, nothing taken
])
def test_allocate_sizes(num_blocks, num_tokens, ok, blocks_used):
    bm = BlockManager(num_blocks, BS)
    s = seq(range(num_tokens))
    assert bm.allocate(s, num_tokens) is ok
    assert len(s.block_table) == blocks_used
    assert bm.num_free_blocks == num_blocks - blocks_used


def test_grow_and_free_returns_every_block():
    bm = BlockManager(8, BS)
    s = seq(range(3))
    for n in (3, 4, 5, 9, 12):  # table grows only when a block boundary is crossed
        assert bm.allocate(s, n)
        assert len(s.block_table) == -(-n // BS)
    bm.free_seq(s)
    assert s.block_table == [] and s.num_computed_tokens == 0
    bm.check_no_leaks()


@pytest.mark.parametrize("prompt_a,prompt_b,expected_hit_blocks", [
    (list(range(12)), list(range(12)), 2),  # identical 12 tokens: 3 full blocks, last kept to compute
    (list(range(13)), list(range(13)), 3),
    (list(range(12)), list(range(8)) + [99, 98, 97, 96], 2),  # shares the first two blocks
    (list(range(12)), [99] + list(range(1, 12)), 0),  # first block differs: the chain breaks
    (list(range(3)), list(range(3)), 0),  # no full block
])
def test_prefix_cache_hits(prompt_a, prompt_b, expected_hit_blocks):
    bm = BlockManager(16, BS)
    a = seq(prompt_a, "a")
    assert bm.allocate(a, a.num_tokens)
    a.num_computed_tokens = a.num_tokens
    bm.cache_full_blocks(a)
    b = seq(prompt_b, "b")
    hits = bm.find_cached_prefix(b)
    assert len(hits) == expected_hit_blocks
    assert hits == a.block_table[:expected_hit_blocks]
    assert bm.allocate(b, b.num_tokens, hits)
    assert b.num_computed_tokens == expected_hit_blocks * BS
    for blk in hits:
        assert bm.blocks[blk].ref_count == 2
    bm.free_seq(a)
    bm.free_seq(b)
    bm.check_no_leaks()


def test_freed_cached_blocks_are_reused_then_evicted_lru():
    bm = BlockManager(4, BS)
    a = seq(range(8), "a")
    bm.allocate(a, 8)
    a.num_computed_tokens = 8
    bm.cache_full_blocks(a)
    bm.free_seq(a)
    assert bm.num_free_blocks == 4 and len(bm.cached) == 2  # cached but evictable
    b = seq(list(range(8)) + [1], "b")
    hits = bm.find_cached_prefix(b)
    assert hits == a.block_table or len(hits) == 2
    # A different request needing all 4 blocks evicts the cached ones.
    c = seq([50] * 16, "c")
    assert bm.allocate(c, 16)
    assert bm.cached == {}
    assert bm.find_cached_prefix(b) == []
    bm.free_seq(c)
    bm.check_no_leaks()


def test_cached_prefix_counts_against_capacity():
    bm = BlockManager(3, BS)
    a = seq(range(8), "a")
    bm.allocate(a, 8)
    a.num_computed_tokens = 8
    bm.cache_full_blocks(a)
    bm.free_seq(a)
    b = seq(list(range(8)) + [7, 7, 7, 7, 7], "b")  # 13 tokens = 4 blocks > 3
    hits = bm.find_cached_prefix(b)
    assert not bm.allocate(b, 13, hits)
    assert b.block_table == [] and bm.num_free_blocks == 3  # refused without side effects
    assert bm.allocate(b, 12, hits)
    bm.free_seq(b)
    bm.check_no_leaks()


@pytest.mark.parametrize("ranges_a,ranges_b,shared", [
    ([("imgA", 2, 6)], [("imgA", 2, 6)], True),  # same image, same place
    ([("imgA", 2, 6)], [("imgB", 2, 6)], False),  # same placeholder tokens, different image
    ([("imgA", 2, 6)], [("imgA", 3, 6)], False),  # same image at another offset
    ([], [], True),
    ([], [("imgB", 0, 4)], False),
])
def test_multimodal_extra_keys_prevent_sharing(ranges_a, ranges_b, shared):
    tokens = [7] * 12  # identical placeholder ids in both requests
    bm = BlockManager(16, BS)
    a = seq(tokens, "a", ranges_a)
    bm.allocate(a, 12)
    a.num_computed_tokens = 12
    bm.cache_full_blocks(a)
    b = seq(tokens + [1], "b", ranges_b)
    hits = bm.find_cached_prefix(b)
    assert len(hits) == (3 if shared else 0)


@pytest.mark.parametrize("ranges,block_start,expected", [
    ([("h", 2, 6)], 0, (("h", 2),)),
    ([("h", 2, 6)], 4, (("h", -2),)),
    ([("h", 2, 6)], 8, ()),  # range ends at 8
    ([("h", 0, 4), ("g", 4, 4)], 4, (("g", 0),)),
])
def test_block_extra_keys(ranges, block_start, expected):
    assert block_extra_keys(ranges, block_start, BS) == expected


def test_hash_chains_parent():
    h1 = hash_block(None, [1, 2, 3, 4])
    assert hash_block(h1, [5, 6, 7, 8]) != hash_block(None, [5, 6, 7, 8])
    assert hash_block(None, [1, 2, 3, 4], (("a", 0),)) != h1


@pytest.mark.parametrize("prompt_len, cached_prefix_blocks", [(1, 0), (7, 0), (8, 0), (10, 2)])
def test_each_block_is_hashed_once_when_it_fills(monkeypatch, prompt_len, cached_prefix_blocks):
    """Decoding token by token hashes each block once, and the published hashes equal the full chain
    (`block_hashes`) at every step, also after adopting a cached prefix."""
    from appliance.engine import block_manager

    bm = BlockManager(16, BS)
    if cached_prefix_blocks:  # an earlier request leaves the first blocks cached
        first = seq(range(prompt_len), "first")
        assert bm.allocate(first, prompt_len)
        first.num_computed_tokens = prompt_len
        bm.cache_full_blocks(first)
        bm.free_seq(first)
    calls = []
    real = block_manager.hash_block
    monkeypatch.setattr(block_manager, "hash_block", lambda *a: calls.append(a[1]) or real(*a))
    s = seq(range(prompt_len), "s")
    hits = bm.find_cached_prefix(s)
    assert len(hits) == cached_prefix_blocks
    calls.clear()  # the admission lookup hashes the prompt once; count only cache_full_blocks
    assert bm.allocate(s, s.num_tokens, hits)
    for step in range(20):
        s.num_computed_tokens = s.num_tokens
        bm.cache_full_blocks(s)
        published = [bm.blocks[b].hash for b in s.block_table if bm.blocks[b].hash is not None]
        counted = len(calls)
        assert published == bm.block_hashes(s, s.num_tokens)
        del calls[counted:]  # the reference chain's own hashing
        s.append_token(100 + step)
        assert bm.allocate(s, s.num_tokens)
    assert len(calls) == s.num_computed_tokens // BS - cached_prefix_blocks  # each filled block once
    assert all(len(tokens) == BS for tokens in calls)
