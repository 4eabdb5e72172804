"""Image embeddings by content hash: LRU within a byte budget, so an image seen again is not re-encoded.

Only rank 0 uses one (it is the rank that runs the vision tower). The budget is
`engine.encoder_cache_bytes`. An entry larger than the whole budget is returned to the caller but not
kept; a budget of 0 keeps nothing, so every request encodes its images again (each lookup a miss).
The model runner also holds, per in-flight request, the embeddings its later prefill chunks still
need, so eviction never makes a request encode an image twice (a preempted request that recomputes
looks the image up again).
"""
from collections import OrderedDict
from typing import Callable, Dict, List, Optional

import torch


class EncoderCache:
    def __init__(self, budget_bytes: int):
        if budget_bytes < 0:
            raise ValueError(f"encoder cache budget must be >= 0 bytes (0 = no cache), got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self.entries: "OrderedDict[str, torch.Tensor]" = OrderedDict()
        self.used_bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    @staticmethod
    def nbytes(t: torch.Tensor) -> int:
        return t.numel() * t.element_size()

    def get(self, key: str) -> Optional[torch.Tensor]:
        t = self.entries.get(key)
        if t is None:
            self.misses += 1
            return None
        self.hits += 1
        self.entries.move_to_end(key)
        return t

    def put(self, key: str, t: torch.Tensor) -> None:
        size = self.nbytes(t)
        if key in self.entries:
            self.used_bytes -= self.nbytes(self.entries.pop(key))
        if not self.budget_bytes or size > self.budget_bytes:
            return
        while self.used_bytes + size > self.budget_bytes:
            _, old = self.entries.popitem(last=False)
            self.used_bytes -= self.nbytes(old)
            self.evictions += 1
        self.entries[key] = t
        self.used_bytes += size

    def get_or_compute_many(self, keys: List[str],
                            compute: Callable[[List[int]], List[torch.Tensor]]) -> List[torch.Tensor]:
        """One lookup per key; the misses computed together by `compute(indices into keys)`. A key
        repeated in `keys` misses once and hits after that, unless the budget is 0 (no cache): then
        every key misses and is computed."""
        if not self.budget_bytes:
            self.misses += len(keys)
            return compute(list(range(len(keys))))
        found: Dict[str, torch.Tensor] = {}
        missing: Dict[str, int] = {}
        for i, key in enumerate(keys):
            if key in missing:
                self.hits += 1
            elif key not in found:
                t = self.get(key)
                if t is None:
                    missing[key] = i
                else:
                    found[key] = t
            else:
                self.hits += 1
        if missing:
            for key, t in zip(missing, compute(list(missing.values()))):
                self.put(key, t)
                found[key] = t
        return [found[key] for key in keys]

    def stats(self) -> dict:
        return {"encoder_cache_hits": self.hits, "encoder_cache_misses": self.misses,
                "encoder_cache_evictions": self.evictions, "encoder_cache_entries": len(self.entries),
                "encoder_cache_bytes": self.used_bytes, "encoder_cache_budget_bytes": self.budget_bytes}
