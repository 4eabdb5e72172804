"""Tensor-parallel process state. Passed explicitly to every layer; world size 1 does no collectives.

The group is a process-group object used directly (`group.allreduce(...)`), never torch's global
default group, so several engines can live in one process.
"""
import datetime
from typing import Optional

import torch
import torch.distributed as dist


def make_group(store: dist.Store, rank: int, world_size: int, device: torch.device, timeout_s: float):
    """Gloo on CPU, NCCL on CUDA, each bounded by `timeout_s` (NCCL takes it through its Options;
    without them its own default, minutes long, applies)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if device.type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options.is_high_priority_stream = False
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, world_size, options)
    return dist.ProcessGroupGloo(store, rank, world_size, timeout)


def rank_device(device: torch.device, rank: int) -> torch.device:
    """Rank r of an engine on `cuda:N` uses card N + r (`cuda` means N = 0); other devices are shared."""
    if device.type != "cuda":
        return device
    return torch.device("cuda", (device.index or 0) + rank)


class ParallelState:
    def __init__(self, rank: int = 0, world_size: int = 1, group: Optional[dist.ProcessGroup] = None):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} out of range for world size {world_size}")
        self.rank = rank
        self.world_size = world_size
        self.group = group

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            self._group().allreduce([x]).wait()
        return x

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        self._group().allgather([parts], [x]).wait()
        return torch.cat(parts, dim=-1)

    def _group(self) -> dist.ProcessGroup:
        if self.group is None:
            raise RuntimeError(f"a tensor-parallel state of {self.world_size} ranks has no process group")
        return self.group

    def shard(self, size: int, what: str) -> int:
        """Per-rank share of a dimension that must split evenly."""
        if size % self.world_size:
            raise ValueError(f"{what} ({size}) is not divisible by tensor_parallel_size "
                             f"({self.world_size}); pick a tensor_parallel_size that divides it")
        return size // self.world_size
