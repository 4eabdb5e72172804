"""Which kernel runs each family of an engine's work, decided once when the engine starts: the one place.

`plan_kernels` builds a frozen `KernelPlan` from the engine's `Host` (its CPU flags), its settled dtype,
`engine.quantization`, `engine.cpu_kernels`, `engine.attention_backend` and whether our CPU kernel library
loaded; the engine logs `describe()` in one line and hands the plan to every rank's runner, which applies
it to its model (packs weights, turns fused ops on) and its sampler. A pool engine builds its own with
`plan_pool_kernels` (the GEMM rules, for its model's linear layers) and applies it to its model the same
way. Layers read what the engine set; nothing else chooses a kernel, and nothing here is process-wide
(two engines, two plans).

The rules (docs/engine.md, "Which kernels run"), for our CPU kernels running in an engine (on CPU, the
library loaded, engine.cpu_kernels on):
- GEMM, fp32 weights: packed for our GEMM, every step.
- GEMM, bf16 weights: packed for our GEMM, every step, on any CPU without AMX: on VDPBF16PS where the CPU
  has AVX512-BF16 (`bf16_units`), else widened to fp32 in registers on AVX2/FMA (torch emulates bf16 there).
  One-row steps too: packing frees torch's layout (keeping both would double the weights' memory), so
  there is no torch product left to run them; the packed kernels stream the weights front to back.
  With AMX, oneDNN's tile unit multiplies a prefill several times faster, so the weights keep torch's
  layout, on torch's GEMM except for a few rows, which run our bf16-weight GEMM (`bf16_weight_rows`).
- GEMM, int8 weights (engine.quantization=int8): `int8_plan` (packed on any CPU without AMX: VPDPBUSD
  with AVX512-VNNI, else VPMADDUBSW on AVX2).
- GEMM, int4 weights (engine.quantization=int4): `int4_plan` (our int4 GEMV for a few rows and our int4
  GEMM past them: on VPDPBUSD with AVX512-VNNI and no AMX, on VPMADDUBSW where torch packs for AVX2;
  else torch's int4 kernel for a few rows and tiles dequantised by our kernel to bf16, or fp32 without
  bf16 units, past them).
- Attention: `attention_select.select_backend` (the paged decode kernel for fp32 and bf16 caches).
- RMSNorm, rotary, SwiGLU, the KV write and the sampler's greedy argmax: ours in fp32 and bf16 engines
  (the bf16 ops round where torch's bf16 ops do; the sampler's logits are fp32 in both).
Without our kernels every family runs on torch (int8 weights on torch's int8 kernel and tiles).
"""
import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch

from appliance.engine import cpu_kernels
from appliance.engine.config import EngineConfig, Quantization, dtype_name, quantization_group_sizes, \
    resolve_dtype
from appliance.engine.host import Host
from appliance.engine.int4 import Int4Plan, learn_layout
from appliance.engine.int4 import kernel_problem as int4_kernel_problem
from appliance.engine.int8 import Int8Plan, kernel_problem

# Rows a step where our few-row bf16-weight GEMM (torch's weight layout) runs on AMX hosts, whose weights
# stay unpacked (docs/engine.md, CPU kernels; measured: docs/benchmarks.md): oneDNN's tiles win from a few
# rows on.
BF16_WEIGHT_ROWS_NATIVE = range(1, 3)
INT8_WEIGHT_ROWS = 32  # rows up to which our int8 GEMM was measured to beat torch's kernel (docs/engine.md)
# Rows up to which torch's int4 kernel beats dequantised bf16 tiles (benchmarks/int4_linear.py, 11008x4096,
# groups of 128, an AVX512-BF16 EPYC, quiet; docs/benchmarks.md). Tiles by our kernel tie at 32 rows: one
# thread 33.7 vs 33.6 ms, two 17.3 vs 17.3 (64 rows: 34 vs 27). Tiles by torch ops (without our kernels) tie
# later: one thread, 64 rows 66.8 vs 81.7 ms, 128 rows 133.5 vs 118.1.
INT4_KERNEL_ROWS = 32
INT4_KERNEL_ROWS_TORCH_TILES = 64
# Rows up to which our int4 GEMV beats our int4 GEMM on VPDPBUSD, both reading torch's AVX-512 packing (same
# benchmark and EPYC, weights from memory, quiet, two threads): 1 row 0.46 vs 1.51 ms (torch's int4 kernel
# 1.19), 16 rows 2.56 vs 3.13, 24 rows 5.46 vs 5.48, 32 rows 7.27 vs 6.48. torch's int4 kernel loses to the
# GEMV at every row count, so it runs nowhere on these hosts.
INT4_GEMV_ROWS = 24
# Rows up to which our AVX2 int4 GEMV beats our AVX2 int4 GEMM, both reading torch's AVX2 packing (same
# benchmark under ATEN_CPU_CAPABILITY=avx2 on the EPYC, two threads, quiet), ms, GEMV against GEMM: 1 row 0.94
# vs 1.72, 8 rows 2.82 vs 2.89, 12 rows 4.56 vs 4.44, 16 rows 5.75 vs 5.93, 24 rows 8.22 vs 7.32, 128 rows
# 42.3 vs 26.0. torch's int4 kernel loses to both at every row count (1 row 2.93, 16 rows 14.7), so it runs
# nowhere where they do.
INT4_GEMV_ROWS_AVX2 = 16

# What each attention backend runs for prefill and decode steps (attention.py, xformers_plan.py).
ATTENTION_KERNELS = {
    "torch": "prefill=torch sdpa, decode=torch sdpa on gathered blocks",
    "cpu": "prefill=torch sdpa, decode=ours paged",
    "xformers": "prefill=xformers flash, decode=xformers split-k paged",
}
POOL_ATTENTION = "torch sdpa"  # pool models call it themselves: whole items, no KV cache


@dataclass(frozen=True)
class KernelPlan:
    device: str  # the engine's device type: cpu or cuda
    dtype: torch.dtype  # the engine's: activations and the weights left unquantized
    cpu_kernels_off: Optional[str]  # why this engine runs without our CPU kernels; None: it runs them
    packed_gemm: bool  # unquantized linear weights packed for our GEMM, which then takes every step
    bf16_units: bool  # packed bf16 weights multiply on AVX512-BF16 (VDPBF16PS); False: widened on AVX2/FMA
    bf16_weight_rows: range  # steps of these many rows run our bf16-weight GEMM on torch's layout
    int8: Optional[Int8Plan]  # how int8 weights multiply (engine.quantization=int8); None: there are none
    attention: str  # the attention backend: torch, cpu or xformers
    fused_ops: bool  # RMSNorm, rotary, SwiGLU and the KV write on our kernels
    argmax: bool  # the sampler's greedy argmax on our kernel
    pool: bool = False  # a pool engine's plan: its models have linear layers and attention, nothing else here
    int4: Optional[Int4Plan] = None  # how int4 weights multiply (engine.quantization=int4)

    def describe(self) -> str:
        """One line: which kernel runs each family (a pool engine's: GEMM and attention, all it runs)."""
        ours = "ours" if self.fused_ops else "torch"
        head = f"kernels ({'pool, ' if self.pool else ''}{self.device}, {dtype_name(self.dtype)}): {self._gemm()}"
        if self.pool:
            return self._off(f"{head}; attention={POOL_ATTENTION}")
        parts = [head, self._int8(), self._int4(), f"attention={self.attention} ({ATTENTION_KERNELS[self.attention]})",
                 f"rmsnorm/rotary/swiglu/kv-write={ours}", f"argmax={'ours' if self.argmax else 'torch'}"]
        return self._off("; ".join(part for part in parts if part))

    def _off(self, line: str) -> str:
        return line if self.cpu_kernels_off is None else f"{line} (our CPU kernels off: {self.cpu_kernels_off})"

    def _gemm(self) -> str:
        gemm = f"gemm {dtype_name(self.dtype)}{' (unquantized weights)' if self.int8 or self.int4 else ''}"
        if self.packed_gemm and self.dtype == torch.bfloat16:
            units = "vdpbf16ps" if self.bf16_units else "avx2 fma, widened to fp32"
            return f"{gemm} every row=ours packed ({units})"
        if self.packed_gemm:
            return f"{gemm} every row=ours packed"
        if self.bf16_weight_rows:
            return f"{gemm} {_rows(self.bf16_weight_rows)}=ours bf16-weight, other rows=torch"
        return f"{gemm}=torch"

    def _int8(self) -> Optional[str]:
        plan = self.int8
        if plan is None:
            return None
        if plan.packed:
            return f"gemm int8 every row=ours packed ({'vpdpbusd' if plan.vnni else 'avx2 vpmaddubsw'})"
        regimes, first = [], 1
        if plan.cpu_kernel_rows:
            regimes.append(f"{_rows(range(1, plan.cpu_kernel_rows + 1))}=ours int8-weight")
            first = plan.cpu_kernel_rows + 1
        if plan.kernel_rows >= first:
            regimes.append(f"{_rows(range(first, plan.kernel_rows + 1))}=torch int8 kernel")
            first = plan.kernel_rows + 1
        tiles = dtype_name(plan.tile_dtype if self.device == "cpu" else self.dtype)
        regimes.append(f"rows {first}+=torch {tiles} tiles")
        return "gemm int8 " + ", ".join(regimes)

    def _int4(self) -> Optional[str]:
        plan = self.int4
        if plan is None:
            return None
        few, kernel = plan.gemv_rows, plan.kernel_rows
        gemv = "ours int4 gemv" if plan.vnni else "ours int4 gemv (avx2)"
        regimes = [f"{_rows(range(1, few + 1))}={gemv}"] if few else []
        if kernel > few:
            regimes.append(f"{_rows(range(few + 1, kernel + 1))}=torch int4 kernel")
        if plan.gemm:
            past = "ours vpdpbusd" if plan.vnni else "ours int4 gemm (avx2)"
        else:
            past = f"{'ours' if plan.ours else 'torch'} {dtype_name(plan.dtype)} tiles"
        regimes.append(f"rows {max(few, kernel) + 1}+={past}")
        return f"gemm int4 (groups of {plan.group_size}) " + ", ".join(regimes)


def plan_kernels(cfg: EngineConfig, host: Host, geometry, device: Optional[torch.device] = None,
                 probe=None, fmha=None) -> KernelPlan:
    """The plan of an engine configured by `cfg` (its dtype settled) on `host`. `geometry`: the model's
    AttentionGeometry (xformers checks it); `device`: where the start-up probes run (rank 0's;
    default cfg.device); `probe` and `fmha` replace xformers' in tests. ValueError, naming the setting,
    when an explicit choice cannot run (an attention backend, int8 weights without torch's kernel)."""
    from appliance.engine import attention_select  # the paged backends: generate engines only, not the pool path

    device = device or torch.device(cfg.device)
    off = cpu_kernels_off(cfg, device.type)
    dtype = resolve_dtype(cfg.dtype)
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():  # the probes' card
        attention = attention_select.select_backend(cfg.attention_backend, device, dtype, geometry, probe, fmha,
                                                    cpu_kernels_off=off)
    if cfg.quantization is Quantization.int8:
        problem = kernel_problem(device)
        if problem:
            raise ValueError(f"engine.quantization=int8 cannot run: {problem}; use engine.quantization=none")
    plan = choose_kernels(cfg, host, off, attention)
    if plan.int4 is not None:
        problem = int4_kernel_problem(plan.int4.layout, plan.int4.dtype)
        if problem:
            raise ValueError(f"engine.quantization=int4 cannot run: {problem}; use engine.quantization=int8")
    return plan


def plan_pool_kernels(cfg: EngineConfig, host: Host) -> KernelPlan:
    """The plan of a pool engine configured by `cfg` (its dtype settled) on `host`: the GEMM rules above
    for its models' linear layers (which the engine makes packable: linear.packable_linears); attention
    stays torch's SDPA, which the models call on whole items (nothing paged), and there are no fused small
    ops or sampler to plan, and bf16 on bf16 units stays on torch's GEMM (below). Pool models run
    unquantized (EngineConfig.verify refuses int8 with kind=pool; this catches a generate config handed to
    a pool engine)."""
    if cfg.quantization not in (Quantization.auto, Quantization.none):
        raise ValueError(f"engine.quantization={cfg.quantization.value}: pool models run unquantized; "
                         f"use engine.quantization=none")
    plan = choose_kernels(cfg, host, cpu_kernels_off(cfg, torch.device(cfg.device).type), "torch")
    # A pool model's GEMMs are prefill-sized (a batch of tiles: thousands of rows), where oneDNN's bf16 GEMM
    # beats our VDPBF16PS one (ViT-L shapes, docs/benchmarks.md); ours stays where bf16 is emulated.
    onednn = plan.dtype == torch.bfloat16 and plan.bf16_units
    return dataclasses.replace(plan, packed_gemm=plan.packed_gemm and not onednn, fused_ops=False, argmax=False,
                               pool=True)


def cpu_kernels_off(cfg: EngineConfig, device_type: str) -> Optional[str]:
    """Why an engine runs without our CPU kernels (None: it runs them); loads the library only for a CPU
    engine that wants it."""
    if not cfg.cpu_kernels:
        return "engine.cpu_kernels=false"
    if device_type != "cpu":
        return f"engine.device={device_type}"
    return None if cpu_kernels.available() else cpu_kernels.unavailable_reason()


def choose_kernels(cfg: EngineConfig, host: Host, cpu_kernels_off: Optional[str], attention: str) -> KernelPlan:
    """The rules above, pure: `cpu_kernels_off` and `attention` as `plan_kernels` found them."""
    dtype = resolve_dtype(cfg.dtype)
    ours = cpu_kernels_off is None
    amx = "amx_bf16" in host.cpu_flags
    fp32_ours = ours and dtype == torch.float32
    bf16_ours = ours and dtype == torch.bfloat16
    return KernelPlan(
        device=torch.device(cfg.device).type, dtype=dtype, cpu_kernels_off=cpu_kernels_off,
        packed_gemm=fp32_ours or (bf16_ours and not amx), bf16_units="avx512_bf16" in host.cpu_flags,
        bf16_weight_rows=BF16_WEIGHT_ROWS_NATIVE if bf16_ours and amx else range(0),
        int8=int8_plan(host, ours) if cfg.quantization is Quantization.int8 else None,
        attention=attention, fused_ops=fp32_ours or bf16_ours, argmax=fp32_ours or bf16_ours,
        int4=int4_plan(host, cfg.quantization_group_size, ours) if cfg.quantization is Quantization.int4 else None)


def int4_plan(host: Host, group_size: int, ours: bool) -> Int4Plan:
    """How int4 weights multiply on `host`, with our CPU kernels running (`ours`) or not. With ours on a
    CPU with AVX512-VNNI and no AMX (whose bf16 tiles outrun VPDPBUSD), where this torch packs int4 as its
    AVX-512 build does (64-row blocks, a byte holding rows j and j + 32): our int4 GEMV for up to
    INT4_GEMV_ROWS rows (reading the packed bytes where they lie, at the memory's rate), past them our
    int4 GEMM (unpacking them into panels: twice bf16's products an instruction, as the int8 GEMM).
    Elsewhere torch's int4 kernel for few rows, past them tiles dequantised (by our kernel, else by torch
    ops, which take much longer: a later crossover), both in bf16 where the CPU has bf16 units (else fp32:
    emulated bf16 is slower than fp32), reading torch's packed layout as this host's torch writes it. With
    ours where torch packs as its AVX2 build does (32-row blocks, a byte holding rows j and j + 16: CPUs
    without AVX-512), our AVX2 int4 GEMV takes steps of up to INT4_GEMV_ROWS_AVX2 rows and our AVX2 int4
    GEMM (VPMADDUBSW on unpacked panels) the rest, instead of torch's int4 kernel and fp32 tiles."""
    dtype = torch.bfloat16 if host.native_bf16 else torch.float32
    layout, flags = learn_layout(), host.cpu_flags
    sizes = quantization_group_sizes()
    if ours and {"avx512_vnni", "avx512bw"} <= flags and "amx_bf16" not in flags and layout.panels_fast:
        return Int4Plan(group_size, 0, dtype, layout, sizes, ours, vnni=True, gemv_rows=INT4_GEMV_ROWS, gemm=True)
    if ours and {"avx2", "fma"} <= flags and layout.avx2_fast:
        return Int4Plan(group_size, 0, dtype, layout, sizes, ours, gemv_rows=INT4_GEMV_ROWS_AVX2, gemm=True)
    return Int4Plan(group_size, INT4_KERNEL_ROWS if ours else INT4_KERNEL_ROWS_TORCH_TILES, dtype, layout, sizes, ours)


def int8_plan(host: Host, ours: bool) -> Int8Plan:
    """How int8 weights multiply on `host`, with our CPU kernels running (`ours`) or not. Without AMX (and
    with AVX2/FMA, which our kernels need) every step takes our packed int8 GEMM: on VPDPBUSD where the CPU
    has AVX512-VNNI (faster than the bf16 GEMM at every size: half the bytes to read at decode sizes, twice
    the products an instruction at prefill sizes), else on VPMADDUBSW (AVX2), where torch's int8 kernel
    reads a decode step's weights below the memory's rate and past it fp32 tiles read 4 bytes a weight.
    With bf16 matrix units (AMX) torch's kernel runs up to 16 rows (it beats a bf16 GEMM at one row but
    loses to it a few rows on), bf16 tiles past it ride the units, and with ours steps of up to
    INT8_WEIGHT_ROWS rows run our int8 GEMM on torch's layout. Without ours: torch's kernel up to 16 rows
    (bf16 units) or 192 (none: bf16 is emulated, and fp32 tiles beat the kernel from about 200 rows), then
    tiles. Figures: docs/benchmarks.md."""
    flags = host.cpu_flags
    tiles = Int8Plan(16, torch.bfloat16) if host.native_bf16 else Int8Plan(192, torch.float32)
    if ours and "amx_bf16" not in flags and {"avx2", "fma"} <= flags:
        return dataclasses.replace(tiles, kernel_rows=0, packed=True, vnni="avx512_vnni" in flags)
    return dataclasses.replace(tiles, cpu_kernel_rows=INT8_WEIGHT_ROWS if ours else 0)


def _rows(rows: range) -> str:
    return f"rows {rows.start}-{rows.stop - 1}"
