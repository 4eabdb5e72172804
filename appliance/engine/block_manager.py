"""Paged KV-cache bookkeeping: block tables, reference counts and the prefix cache.

Pure Python; the model runner only ever sees the block ids. A full block's hash chains its parent's
hash, its tokens and the multimodal items overlapping it, so a block is shared only when the whole
prefix up to and including it is identical, images included.
"""
import hashlib
from collections import OrderedDict
from typing import List, Optional, Sequence as Seq, Tuple

from appliance.engine.sequence import MMRange, Sequence


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def block_extra_keys(mm_ranges: Seq[MMRange], block_start: int, block_size: int) -> Tuple:
    """Multimodal identity of the tokens in [block_start, block_start + block_size).

    Each overlapping item contributes (mm_hash, start - block_start): the same placeholder tokens for
    a different image, or the same image at a different offset, give a different key.
    """
    end = block_start + block_size
    return tuple((h, start - block_start) for h, start, length in mm_ranges
                 if start < end and start + length > block_start)


def hash_block(parent: Optional[bytes], token_ids: Seq[int], extra_keys: Tuple = ()) -> bytes:
    """Chained content hash of one full block (sha256: a collision would silently share wrong KV)."""
    h = hashlib.sha256(parent or b"root")
    h.update(repr((tuple(token_ids), extra_keys)).encode())
    return h.digest()


class Block:
    __slots__ = ("block_id", "ref_count", "hash")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash: Optional[bytes] = None


class BlockManager:
    """Hands out KV blocks; free blocks are reused least-recently-freed first.

    A block whose ref count drops to 0 keeps its hash and stays findable until it is reused, so a later
    request with the same prefix can pick it up again ("cached, evictable").
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"the KV cache needs >= 1 block of >= 1 token, got {num_blocks} x {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: "OrderedDict[int, None]" = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict = {}  # hash -> block id
        self.num_hit_tokens = 0
        self.num_query_tokens = 0

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def block_hashes(self, seq: Sequence, num_tokens: int) -> List[bytes]:
        """Hashes of the full blocks among the first `num_tokens` tokens of `seq`."""
        hashes, parent = [], None
        for i in range(num_tokens // self.block_size):
            parent = self._chained_hash(parent, seq, i)
            hashes.append(parent)
        return hashes

    def _chained_hash(self, parent: Optional[bytes], seq: Sequence, index: int) -> bytes:
        """The hash of `seq`'s full block number `index`, chained on the hash of the block before it."""
        bs = self.block_size
        return hash_block(parent, seq.token_ids[index * bs:(index + 1) * bs],
                          block_extra_keys(seq.mm_ranges, index * bs, bs))

    def find_cached_prefix(self, seq: Sequence) -> List[int]:
        """Block ids already holding this sequence's leading full blocks.

        At least one token is always left to compute, since the last prompt position must produce logits.
        """
        if not self.enable_prefix_caching:
            return []
        found = []
        for h in self.block_hashes(seq, seq.num_tokens - 1):
            block_id = self.cached.get(h)
            if block_id is None:
                break
            found.append(block_id)
        return found

    def can_allocate(self, seq: Sequence, num_tokens: int, cached_prefix: Seq[int] = ()) -> bool:
        held = len(seq.block_table) + len(cached_prefix)
        revived = sum(1 for b in cached_prefix if self.blocks[b].ref_count == 0)
        return cdiv(num_tokens, self.block_size) - held <= len(self.free) - revived

    def allocate(self, seq: Sequence, num_tokens: int, cached_prefix: Seq[int] = ()) -> bool:
        """Grow `seq`'s table so it covers `num_tokens` tokens; False (and no change) if blocks run out.

        `cached_prefix` (from `find_cached_prefix`, only for a sequence holding no blocks) is adopted
        first and its tokens count as computed.
        """
        if not self.can_allocate(seq, num_tokens, cached_prefix):
            return False
        if not seq.block_table and self.enable_prefix_caching:
            self.num_query_tokens += seq.num_tokens
        if cached_prefix:
            assert not seq.block_table, "a cached prefix can only start an empty block table"
            for block_id in cached_prefix:
                self._take(block_id)
                seq.block_table.append(block_id)
            seq.num_computed_tokens = seq.num_cached_tokens = len(cached_prefix) * self.block_size
            self.num_hit_tokens += seq.num_cached_tokens
        while len(seq.block_table) * self.block_size < num_tokens:
            block_id = next(iter(self.free))  # least recently freed
            block = self.blocks[block_id]
            if block.hash is not None:  # evict: the block is about to hold other tokens
                if self.cached.get(block.hash) == block_id:
                    del self.cached[block.hash]
                block.hash = None
            self._take(block_id)
            seq.block_table.append(block_id)
        return True

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Publish the hashes of blocks whose K/V are now fully computed. Each block is hashed once, when
        it fills: the hashed blocks of a table are always a prefix of it (adopted from the prefix cache,
        or filled in order), so the work starts after the last hashed one, chained on its hash."""
        if not self.enable_prefix_caching:
            return
        bs, table = self.block_size, seq.block_table
        full = min(seq.num_computed_tokens // bs, len(table))
        start = full
        while start > 0 and self.blocks[table[start - 1]].hash is None:
            start -= 1  # back over the blocks filled since the last call (one, in a decode step)
        parent = self.blocks[table[start - 1]].hash if start else None
        for i in range(start, full):
            parent = self._chained_hash(parent, seq, i)
            block = self.blocks[table[i]]
            block.hash = parent
            self.cached.setdefault(parent, block.block_id)  # a twin computed in the same step stays private

    def free_seq(self, seq: Sequence) -> None:
        # Tail first, so a prefix's later blocks are evicted before its earlier ones.
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block_id} freed twice"
            if block.ref_count == 0:
                if block.hash is not None and self.cached.get(block.hash) != block_id:
                    block.hash = None  # a private twin: nothing can find it, forget its hash
                self.free[block_id] = None
        seq.block_table = []
        seq.num_computed_tokens = 0

    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free[block_id]
        block.ref_count += 1

    def check_no_leaks(self) -> None:
        """Every block is free (maybe cached and evictable); raise listing any that are still held."""
        held = [b.block_id for b in self.blocks if b.ref_count]
        if held or len(self.free) != self.num_blocks:
            raise AssertionError(f"KV blocks still held: {held}; free {len(self.free)}/{self.num_blocks}")
