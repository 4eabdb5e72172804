"""Our CPU kernels (csrc/). For fp32 engines, on AVX2: a GEMM on prepacked weights, paged decode attention
reading K/V in place, and fused small ops (RMSNorm, rotary, KV-cache write, SwiGLU, argmax). For bf16
engines: a GEMM on bf16 weights prepacked once, multiplied on VDPBF16PS (CPUs with AVX512-BF16) or widened
to fp32 in registers (AVX2/FMA, CPUs without bf16 units), and a bf16-weight GEMM for few rows on torch's
layout. For int8 weights (int8.py): a weight-only GEMM for few rows on AVX2 (int8 rows times fp32
activations), and a packed GEMM which quantises the activations to int8 too (per row and per 512 k), on
VPDPBUSD (CPUs with AVX512-VNNI) or on VPMADDUBSW (AVX2) from the same panels. For int4 weights
(int4.py): decode and prefill on VPDPBUSD (AVX512-VNNI) from torch's packed bytes, decode on VPMADDUBSW
(AVX2) from torch's AVX2 packing, or their tiles dequantised for a dense GEMM elsewhere.

They are torch operators (`torch.ops.appliance.*`, csrc/cpu_ops.cpp) that check every argument (dtype,
device, shape, strides, block / slot / position ids in range) and raise ValueError or IndexError before
any C code runs. The library is built once at install (`python -m appliance.engine.build_kernels`) and
loaded from the package; without that, the first use builds it into a private cache (build_kernels.py).
Where it cannot be built or loaded, `available()` is False with the reason in `unavailable_reason()`, and
engines run on torch's kernels alone.

Which of them an engine runs is its kernel plan's choice (kernel_plan.py: one per engine, logged at
start): its runner packs its model's linear weights (`linear.pack_for_cpu`) and turns the fused small ops
on in its model's layers (`use_in(model)`) as the plan says; nothing here is switched process-wide.
"""
import functools
import logging
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import nn

from appliance.engine.build_kernels import KernelBuildError, find_or_build
from appliance.engine.config import dtype_name

log = logging.getLogger(__name__)

PACKED_DTYPES = (torch.float32, torch.bfloat16, torch.int8)


@dataclass(frozen=True)
class KernelLibrary:
    path: Optional[str]  # the loaded shared object, or None
    reason: Optional[str] = None  # why it is not loaded


@functools.lru_cache(maxsize=None)
def library() -> KernelLibrary:
    """Find (or build) and load the library, once per process: the operators it registers are global
    to torch, like any loaded extension."""
    try:
        path = find_or_build()
        torch.ops.load_library(str(path))
    except (KernelBuildError, OSError, RuntimeError) as e:
        reason = str(e).strip().splitlines()[0][:500] if str(e).strip() else type(e).__name__
        log.warning("CPU kernels unavailable, using torch's: %s", reason)
        return KernelLibrary(None, reason)
    return KernelLibrary(str(path))


def available() -> bool:
    return library().path is not None


def unavailable_reason() -> Optional[str]:
    return library().reason


def ops():
    """torch.ops.appliance, loaded; RuntimeError naming the reason where the kernels are unavailable."""
    if not available():
        raise RuntimeError(f"our CPU kernels are unavailable: {unavailable_reason()}")
    return torch.ops.appliance


class KernelLayer(nn.Module):
    """A layer with a path on our kernels. Off until the runner that owns the model turns it on
    (`use_in`), so two engines in one process each keep their own choice."""

    use_cpu_kernels: bool = False


def use_in(model: nn.Module) -> None:
    """Turn our kernels on in every KernelLayer of `model` (the runner, once, where its kernel plan says)."""
    for module in model.modules():
        if isinstance(module, KernelLayer):
            module.use_cpu_kernels = True


SMALL_OP_DTYPES = (torch.float32, torch.bfloat16)  # the dtypes the small ops (RMSNorm, rotary, ...) take


def fits(first: torch.Tensor, *others: torch.Tensor) -> bool:
    """Every tensor is on the CPU with unit stride in its last dim, all fp32 or all bf16: the small ops
    take them."""
    dtype = first.dtype
    if dtype not in SMALL_OP_DTYPES:
        return False
    for t in (first, *others):  # a plain loop: this runs ~50 times a decode step
        if not t.is_cpu or t.dtype != dtype or t.stride(-1) != 1:
            return False
    return True


class PackedWeight:
    """A linear layer's [N, K] weight repacked for our GEMM, zero-padded, in the layout csrc/panel_layout.h
    defines (the library says the shape: `shape`): fp32 in panels of outputs, one k at a time; bf16 and
    int8 in wider panels, each output's k pairs or quads side by side, as VDPBF16PS and VPDPBUSD multiply
    them (CPUs with AVX512-BF16 / AVX512-VNNI), int8 as unsigned bytes (q + 128) with its fp32 `scale` per
    output. `out`, if given, is the flat buffer (of `numel(N, K, dtype)` elements)
    to pack into. A bf16 weight multiplies on the CPU's bf16 units (`bf16_units`, VDPBF16PS) or, without
    them, widened to fp32 in registers (AVX2/FMA) from the same panels; an int8 one on VPDPBUSD (`vnni`)
    or on AVX2 alone (VPMADDUBSW), the same product: the engine's kernel plan says which."""

    def __init__(self, weight: torch.Tensor, out: Optional[torch.Tensor] = None,
                 scale: Optional[torch.Tensor] = None, bf16_units: bool = True, vnni: bool = True):
        if weight.dtype not in PACKED_DTYPES or weight.device.type != "cpu" or weight.dim() != 2:
            raise ValueError(f"only 2-D fp32, bf16 or int8 CPU weights pack, got {weight.dtype} "
                             f"{tuple(weight.shape)} on {weight.device}")
        if (weight.dtype == torch.int8) != (scale is not None):
            raise ValueError("an int8 weight packs with its scales, and only an int8 weight")
        self.out_features, self.in_features = weight.shape
        self.scale = scale
        self.bf16_units = bf16_units
        self.vnni = vnni
        shape = self.shape(self.out_features, self.in_features, weight.dtype)
        self.data = torch.empty(shape, dtype=weight.dtype) if out is None else out.view(shape)
        ops().pack_weight(weight, self.data.view(-1))

    @staticmethod
    def shape(out_features: int, in_features: int, dtype: torch.dtype = torch.float32) -> Tuple[int, int, int]:
        """[panels, k rows, values a panel row] of an [N, K] weight of `dtype`, packed: the library's
        layout (csrc/panel_layout.h), asked of it, never restated here."""
        panels, rows, width = ops().packed_shape(out_features, in_features, dtype)
        return panels, rows, width

    @staticmethod
    def numel(out_features: int, in_features: int, dtype: torch.dtype = torch.float32) -> int:
        a, b, c = PackedWeight.shape(out_features, in_features, dtype)
        return a * b * c

    @property
    def nbytes(self) -> int:
        scale = 0 if self.scale is None else self.scale.numel() * self.scale.element_size()
        return self.data.numel() * self.data.element_size() + scale

    @property
    def units(self) -> bool:
        """It multiplies on the CPU's AVX-512 dot-product units (VDPBF16PS, VPDPBUSD), not on AVX2 alone."""
        return self.vnni if self.data.dtype == torch.int8 else self.bf16_units

    @property
    def input_dtypes(self) -> Tuple[torch.dtype, ...]:
        """What x may be (y comes in x's dtype): bf16 for a bf16 weight on bf16 units (VDPBF16PS multiplies
        bf16 pairs), bf16 or fp32 for one widened to fp32, else fp32 (an int8 weight's GEMM quantises x
        itself)."""
        if self.data.dtype != torch.bfloat16:
            return (torch.float32,)
        return (torch.bfloat16,) if self.bf16_units else (torch.bfloat16, torch.float32)


def linear(x: torch.Tensor, weight: PackedWeight, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """F.linear(x, w, bias) for x [..., K] on CPU in one of the weight's `input_dtypes`, w given as a
    PackedWeight."""
    k, n = weight.in_features, weight.out_features
    if x.dtype not in weight.input_dtypes or x.device.type != "cpu" or x.shape[-1] != k:
        names = " or ".join(dtype_name(t) for t in weight.input_dtypes)
        raise ValueError(f"packed linear takes {names} CPU input [..., {k}], got {x.dtype} {tuple(x.shape)}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    y = ops().linear_packed(x2 if x2.stride(1) == 1 else x2.contiguous(), weight.data, n, weight.scale,
                            weight.units)
    if bias is not None:
        y.add_(bias)
    return y.view(*lead, n)


PAGED_DECODE_DTYPES = (torch.float32, torch.bfloat16)  # the caches our paged decode attention reads


def handles_paged_decode(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    return (q.is_cpu and k_cache.is_cpu and k_cache.dtype in PAGED_DECODE_DTYPES and q.dtype in PAGED_DECODE_DTYPES
            and k_cache.is_contiguous() and q.shape[-1] % 8 == 0)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """q: [B, Hq, D] (one token per sequence); caches: [num_blocks, block_size, Hk, D], fp32 or bf16 (read
    in place, computed in fp32); block_tables: [B, width]; context_lens: [B]. Returns [B, Hq, D] in q's dtype."""
    return ops().paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm over the last dim of a 2-D x (rows may be strided); fp32, or bf16 rounded as
    layers.RMSNorm's torch path rounds (so are the other small ops below)."""
    return ops().rms_norm(x, weight, eps)


def rotary_(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Neox rotary embedding applied in place. q: [T, Hq, D], k: [T, Hk, D], each with contiguous
    heads (rows may be strided, e.g. views into the fused qkv output); cos/sin: [P, D] contiguous."""
    ops().rotary_(q, k, positions, cos, sin)


def write_kv(k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor, k_cache: torch.Tensor,
             v_cache: torch.Tensor) -> None:
    """k_cache/v_cache viewed as [slots, Hk * D]: row slots[t] <- k[t] / v[t]. k, v: [T, Hk, D] with
    contiguous heads (rows may be strided); caches contiguous."""
    ops().write_kv(k, v, slots, k_cache, v_cache)


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU of a [M, 2I]: silu(x[:, :I]) * x[:, I:]."""
    return ops().silu_mul(x)


def linear_int8(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x qᵀ · scale for x [M, K] fp32 (rows may be strided), q [N, K] int8 and scale [N] fp32, both
    contiguous: an int8 weight-only GEMM for few rows (decode), each weight row read once for all M."""
    return ops().linear_int8(x, q, scale)


def linear_bf16w(x: torch.Tensor, w: torch.Tensor, bf16_units: bool = True) -> torch.Tensor:
    """x wᵀ in fp32 for x [M, K] fp32 (rows may be strided) and w [N, K] bf16, contiguous: a bf16-weight
    GEMM for few rows (decode), each weight row read once for all M. On CPUs with AVX512-BF16 x is rounded
    to bf16 and multiplied in bf16 pairs (exact for a bf16 engine's activations); elsewhere the weight is
    widened to fp32 in registers (everywhere with `bf16_units=False`)."""
    return ops().linear_bf16w(x, w, bf16_units)


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """x.argmax(dim=-1) for a 2-D x (torch's CPU argmax is not vectorised, and a step's logits are wide)."""
    return ops().argmax_rows(x)


def int4_tiles_(packed: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, block_rows: int, halves: bool,
                group_size: int, out: torch.Tensor) -> None:
    """out [K, cols] (fp32 or bf16; rows may be strided) = the int4 weight rows packed in torch's layout
    ([cols, K/2] uint8, blocks of `block_rows` rows; a byte's nibbles hold rows j and j + block_rows/2
    where `halves`, else 2j and 2j+1) dequantised, w = q · scale + offset (scale, offset [K/g, cols] fp32
    holding values of out's dtype), transposed: a GEMM's right side (engine/int4.py). The product and the
    sum are each rounded to out's dtype, as torch's ops round them."""
    ops().int4_tiles_(packed, scale, offset, block_rows, halves, group_size, out)


def linear_int4(x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor, block_rows: int, halves: bool,
                tail_halves: bool, group_size: int) -> torch.Tensor:
    """x Wᵀ in fp32 for x [M, K] fp32 (rows may be strided) and an int4 weight as torch's kernel holds it:
    `packed` [N, K/2] uint8 in its CPU layout (blocks of `block_rows` rows, a byte's nibbles holding rows j
    and j + rows/2 where `halves`, else 2j and 2j+1; `tail_halves` for a short last block) and
    `scales_and_zeros` [K/g, N, 2] (fp32 or bf16), w = (q - 8) · scale + zero. On VPDPBUSD (CPUs with
    AVX512-VNNI), x quantised to int8 per row and group of `group_size` k (engine/int4.py, prefill sizes)."""
    return ops().linear_int4(x, packed, scales_and_zeros, block_rows, halves, tail_halves, group_size)


def gemv_int4(x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor, tail_halves: bool,
              group_size: int) -> torch.Tensor:
    """`linear_int4` for a few rows (decode), the same bits, reading torch's AVX-512 packing (64-row blocks,
    a byte's nibbles holding rows j and j + 32) where it lies instead of unpacking it into panels."""
    return ops().gemv_int4(x, packed, scales_and_zeros, tail_halves, group_size)


def gemv_int4_avx2(x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor, tail_halves: bool,
                   group_size: int) -> torch.Tensor:
    """`gemv_int4` on AVX2 alone (VPMADDUBSW; CPUs without AVX512-VNNI), reading torch's AVX2 packing
    (32-row blocks, a byte's nibbles holding rows j and j + 16) where it lies; x quantised as there, the
    same bits."""
    return ops().gemv_int4_avx2(x, packed, scales_and_zeros, tail_halves, group_size)


def linear_int4_avx2(x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor, tail_halves: bool,
                     group_size: int) -> torch.Tensor:
    """`gemv_int4_avx2` for prefill sizes: the AVX2 packing unpacked a few blocks at a time into panels
    (VPMADDUBSW, products summed in int16 before widening), the same bits."""
    return ops().linear_int4_avx2(x, packed, scales_and_zeros, tail_halves, group_size)
