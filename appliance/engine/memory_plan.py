"""Before any weight loads: the dtype an engine runs in, the size of its KV cache, and whether the model
fits the machine at all. Pure functions of the config, the checkpoint's facts (checkpoint_facts.py) and
the machine (`Host`, host.py), so every rule is tested with a made-up machine.

dtype (`engine.dtype`; `auto` is the default): an explicit dtype wins. `auto` takes the checkpoint's
own dtype: float32 stays float32; a half precision checkpoint runs as itself on CUDA and as bfloat16
on CPU (fp16 arithmetic is slow there), except on a CPU without bf16 units (no `amx_bf16`, no
`avx512_bf16`: torch emulates bf16, several times slower than fp32) where float32 is chosen if its
weights (plus the smallest KV cache) fit.

KV cache (`engine.kv_cache_memory_bytes`, per rank; `null`, the default, derives it):
- CPU: half of what is left of MemAvailable after the weights and a runtime reserve per process, at
  most 4 GiB (the default of vLLM's CPU backend, `VLLM_CPU_KVCACHE_SPACE`), never more than
  `max_num_seqs` sequences of `max_model_len` tokens need, never less than one such sequence;
- CUDA: 90 % of the card (vLLM's `gpu_memory_utilization`) less what is already in use on it, the
  weights' share of this rank and the runtime reserve.
`engine.num_kv_blocks` or an explicit `kv_cache_memory_bytes` wins.

A model that cannot fit (weights + the KV cache, at least one `max_model_len` sequence when derived,
+ the reserve, against the memory available) is refused with one line that names the figures and
the dtype or quantization that would fit. With `engine.quantization: int8` the decoder's projections
count a byte a weight once loaded (int4: half a byte, plus a scale and a zero a group); they load in the
dtype first, so the whole checkpoint in the dtype (+ the reserve) must fit too, before any KV cache exists.
"""
import math
from dataclasses import dataclass
from typing import Optional

import torch

from appliance.engine.attention_geometry import AttentionGeometry
from appliance.engine.checkpoint_facts import CheckpointFacts
from appliance.engine.config import DType, EngineConfig, Quantization, dtype_name, resolve_dtype
from appliance.engine.host import NATIVE_BF16_FLAGS, Host
from appliance.errors import ConfigError

GIB = 1 << 30
RUNTIME_RESERVE_BYTES = 1 * GIB  # per process: torch and its threads, a step's activations, the image tower's
CPU_KV_SHARE = 0.5
CPU_KV_CAP_BYTES = 4 * GIB
CUDA_MEMORY_UTILIZATION = 0.9


@dataclass(frozen=True)
class MemoryPlan:
    dtype: torch.dtype
    dtype_reason: str
    kv_cache_memory_bytes: int  # per rank; 0 for a pool engine
    kv_reason: str

    @property
    def dtype_name(self) -> str:
        return dtype_name(self.dtype)


def plan_memory(cfg: EngineConfig, facts: CheckpointFacts, host: Host, source: str,
                kv: Optional[AttentionGeometry] = None, max_model_len: int = 0) -> MemoryPlan:
    """The engine's dtype and KV budget; ConfigError when the model cannot fit. `kv`: one rank's
    attention geometry with its layers (None for a pool engine: weights only)."""
    if cfg.memory_budget_bytes is not None:
        host = host.within(cfg.memory_budget_bytes)
    sizing = _Sizing(cfg, facts, host, kv, max_model_len)
    dtype, dtype_reason = choose_dtype(cfg, facts, host, sizing.fits)
    kv_bytes, kv_reason = sizing.kv_budget(dtype)
    sizing.refuse_unless_fits(dtype, kv_bytes, kv_reason, source)
    return MemoryPlan(dtype, dtype_reason, kv_bytes, kv_reason)


def choose_dtype(cfg: EngineConfig, facts: CheckpointFacts, host: Host, fits=lambda dtype: True):
    """(dtype, why) per the module docstring; `fits(dtype)` says whether the model fits in it."""
    if cfg.dtype is not DType.auto:
        return resolve_dtype(cfg.dtype), f"engine.dtype={cfg.dtype.value}"
    own = dtype_name(facts.dtype)
    settled = auto_dtype_without_host(facts.dtype, str(cfg.device))
    if settled is not None:
        return settled, f"auto: the checkpoint's {own}"
    units = sorted(set(NATIVE_BF16_FLAGS) & host.cpu_flags)
    if units:
        return torch.bfloat16, f"auto: the checkpoint's {own}, as bfloat16 on this CPU ({', '.join(units)})"
    if fits(torch.float32):
        return torch.float32, (f"auto: the checkpoint is {own} but this CPU has no bf16 units (no "
                               f"{' or '.join(NATIVE_BF16_FLAGS)}), and float32 fits")
    return torch.bfloat16, (f"auto: the checkpoint's {own} as bfloat16, emulated on this CPU (no "
                            f"{' or '.join(NATIVE_BF16_FLAGS)}): float32 does not fit")


def auto_dtype_without_host(own: torch.dtype, device: str) -> Optional[torch.dtype]:
    """What `auto` makes of a checkpoint in `own` dtype on `device` where the host has no say: float32
    (or wider) runs as float32, anything on CUDA as itself; None for a half precision checkpoint on CPU,
    where the host's bf16 units (and its memory) decide (`choose_dtype`)."""
    if own == torch.float32 or own.itemsize > 2:
        return torch.float32
    if device.startswith("cuda"):
        return own
    return None


class _Sizing:
    """Memory arithmetic for one engine on one machine."""

    def __init__(self, cfg: EngineConfig, facts: CheckpointFacts, host: Host, kv: Optional[AttentionGeometry],
                 max_model_len: int):
        self.cfg, self.facts, self.host, self.kv, self.max_model_len = cfg, facts, host, kv, max_model_len
        self.world = max(1, cfg.tensor_parallel_size)
        self.cuda = str(cfg.device).startswith("cuda")
        self.int8 = cfg.quantization is Quantization.int8
        self.int4_group = cfg.quantization_group_size if cfg.quantization is Quantization.int4 else None

    def weights(self, dtype: torch.dtype, int8: Optional[bool] = None, int4_group: Optional[int] = None) -> int:
        """Weights once loaded (int8 or int4 projections as this engine quantizes, unless `int8` or
        `int4_group` says) on the device that `host` describes: a card holds its rank's share, a host all
        ranks'."""
        if int8 is None and int4_group is None:
            int8, int4_group = self.int8, self.int4_group
        total = self.facts.weight_bytes(dtype, bool(int8), int4_group)
        return math.ceil(total / self.world) if self.cuda else total

    def reserve(self) -> int:
        return RUNTIME_RESERVE_BYTES * (1 if self.cuda else self.world)

    def ranks_here(self) -> int:
        return 1 if self.cuda else self.world

    def min_kv(self, dtype: torch.dtype) -> int:
        """One max_model_len sequence, per rank."""
        return self.kv.bytes_for(self.max_model_len, dtype) if self.kv else 0

    def need(self, dtype: torch.dtype, kv_per_rank: int, int8: Optional[bool] = None,
             int4_group: Optional[int] = None) -> int:
        serving = self.weights(dtype, int8, int4_group) + self.ranks_here() * kv_per_rank + self.reserve()
        loading = self.weights(dtype, int8=False) + self.reserve()  # int8, int4: quantized after loading
        return max(serving, loading)

    def fits(self, dtype: torch.dtype) -> bool:
        """Known to fit (unknown memory: no, so auto never doubles the weights on a guess)."""
        return self.host.memory_known and self.need(dtype, self.min_kv(dtype)) <= self.host.memory_available

    def kv_budget(self, dtype: torch.dtype):
        """(bytes per rank, why)."""
        if self.kv is None:
            return 0, "no KV cache (pool engine)"
        if self.cfg.num_kv_blocks:
            return self.cfg.num_kv_blocks * self.kv.block_bytes(dtype), "engine.num_kv_blocks"
        if self.cfg.kv_cache_memory_bytes is not None:
            return self.cfg.kv_cache_memory_bytes, "engine.kv_cache_memory_bytes"
        useful = self.kv.bytes_for(self.max_model_len, dtype) * max(1, self.cfg.max_num_seqs)
        if not self.host.memory_known:
            return min(CPU_KV_CAP_BYTES, useful), "derived: memory unknown, the 4 GiB default"
        if self.cuda:
            used_elsewhere = self.host.memory_total - self.host.memory_available
            room = int(CUDA_MEMORY_UTILIZATION * self.host.memory_total) - used_elsewhere \
                - self.weights(dtype) - self.reserve()
            why = f"derived: {CUDA_MEMORY_UTILIZATION:.0%} of the card after the weights"
        else:
            spare = self.host.memory_available - self.weights(dtype) - self.reserve()
            room = min(int(CPU_KV_SHARE * spare), CPU_KV_CAP_BYTES) // self.world  # all ranks share the host
            why = f"derived: half the memory left after the weights, at most {_gib(CPU_KV_CAP_BYTES)}"
        if room >= useful:
            return useful, f"derived: what max_num_seqs={self.cfg.max_num_seqs} full-length sequences use"
        return max(room, self.min_kv(dtype)), why

    def refuse_unless_fits(self, dtype: torch.dtype, kv_per_rank: int, kv_reason: str, source: str) -> None:
        if not self.host.memory_known:
            return
        need = self.need(dtype, kv_per_rank)
        available = self.host.memory_available
        if need <= available:
            return
        derived = kv_reason.startswith("derived")
        kv_what = f"one {self.max_model_len}-token sequence" if derived else kv_reason
        kv_total = self.ranks_here() * kv_per_rank
        where = str(self.cfg.device) if self.cuda else "this machine"
        name = dtype_name(dtype)
        parts = f"{_gib(self.weights(dtype))} of weights in {name}"
        if self.kv is not None:
            parts += f" + {_gib(kv_total)} of KV cache ({kv_what})"
        parts += f" + {_gib(self.reserve())} runtime reserve"
        raise ConfigError(f"{source} does not fit: it needs {_gib(need)} ({parts}) but {where} has "
                          f"{_gib(available)} available; {self._what_fits(dtype, kv_per_rank, derived)}")

    def _what_fits(self, dtype: torch.dtype, kv_per_rank: int, kv_derived: bool) -> str:
        if dtype.itemsize > torch.bfloat16.itemsize:
            kv = self.min_kv(torch.bfloat16) if kv_derived else kv_per_rank
            need = self.need(torch.bfloat16, kv)
            if need <= self.host.memory_available:
                return f"engine.dtype=bfloat16 would need {_gib(need)}, which fits"
        hints = ["more memory"]
        if self.kv is not None:
            hints.append("a smaller engine.max_model_len" if kv_derived else "a smaller engine.kv_cache_memory_bytes")
        kv = self.min_kv(dtype) if kv_derived else kv_per_rank
        if not self.int8 and self.int4_group is None and self.kv is not None:
            need = self.need(dtype, kv, int8=True)
            if need <= self.host.memory_available:
                return f"engine.quantization=int8 would need {_gib(need)}, which fits"
        if self.int4_group is None and self.kv is not None and not self.cuda:
            group = self.cfg.quantization_group_size
            need = self.need(dtype, kv, int4_group=group)
            if need <= self.host.memory_available:
                return f"engine.quantization=int4 would need {_gib(need)}, which fits"
        return f"no dtype or quantization this engine runs fits: use {' or '.join(hints)}"


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"
