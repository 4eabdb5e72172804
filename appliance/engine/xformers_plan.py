"""Which xformers kernel runs each kind of step, and why a configuration cannot run at all.

Pure: decided from the limits the kernels declare (read from an installed xformers, or the values
recorded from 0.0.35 when it is not installed), without a GPU. The facts, with file and line in
xformers' source, are in docs/engine.md ("The xformers backend").

- decode steps (every sequence computes one token) read the paged KV pool in place through
  `triton_splitk.FwOp` with a `PagedBlockDiagonalPaddedKeysMask`: it takes pages that are a multiple
  of its `BLOCK_N` (64) and a few head dims;
- prefill steps (whole prompts, nothing cached) and mixed steps (chunks after cached tokens, prefix
  hits, decodes beside prefills) run `flash.FwOp` (torch's own FlashAttention-2 when no flash_attn
  wheel is installed) on contiguous keys with a `BlockDiagonalCausalFromBottomRightMask`; mixed steps
  gather each sequence's keys from the pool first. Flash takes no paged mask without the wheel.
"""
from dataclasses import dataclass
from typing import FrozenSet, Optional, Tuple

from appliance.engine.config import dtype_name

DECODE, PREFILL, MIXED = "decode", "prefill", "mixed"
STEP_KINDS = (DECODE, PREFILL, MIXED)

DECODE_OP, VARLEN_OP = "triton_splitk.FwOp", "flash.FwOp"
DECODE_BIAS, VARLEN_BIAS = "PagedBlockDiagonalPaddedKeysMask", "BlockDiagonalCausalFromBottomRightMask"
# Both ops also need the head dim to be a multiple of 8 (a literal in their checks, not an attribute).
HEAD_DIM_ALIGN = 8
_HEAD_DIM_RANGE = range(1, 1025)  # head dims worth asking the kernels about


@dataclass(frozen=True)
class OpLimits:
    dtypes: FrozenSet[str]  # "float16", "bfloat16", ...
    head_dims: FrozenSet[int]
    page_multiple: int = 0  # paged op: block_size % page_multiple == 0; 0 = not paged
    takes_bias: bool = True  # lists the mask we give it in SUPPORTED_ATTN_BIAS_TYPES


@dataclass(frozen=True)
class XformersLimits:
    decode: OpLimits
    varlen: OpLimits

    @classmethod
    def from_fmha(cls, fmha) -> "XformersLimits":
        """Read from `xformers.ops.fmha` (or a module shaped like it): the class attributes and the
        shape check each op runs before it accepts inputs."""
        return cls(decode=_limits(fmha.triton_splitk.FwOp, getattr(fmha.attn_bias, DECODE_BIAS),
                                  page_multiple=fmha.triton_splitk.FwOp.BLOCK_N),
                   varlen=_limits(fmha.flash.FwOp, getattr(fmha.attn_bias, VARLEN_BIAS)))


def _limits(op, bias_type, page_multiple: int = 0) -> OpLimits:
    dims = frozenset(d for d in _HEAD_DIM_RANGE
                     if d % HEAD_DIM_ALIGN == 0 and not op.shape_not_supported_reasons(1, 1, d, d))
    return OpLimits(dtypes=frozenset(dtype_name(t) for t in op.SUPPORTED_DTYPES), head_dims=dims,
                    page_multiple=page_multiple, takes_bias=bias_type in tuple(op.SUPPORTED_ATTN_BIAS_TYPES))


# What xformers 0.0.35 declares (triton_splitk.py: BLOCK_N 64, head dims 16..512; flash.py: fp16/bf16,
# head dims up to 256), for `appliance check` on hosts without xformers; tested equal to from_fmha.
XFORMERS_0_0_35 = XformersLimits(
    decode=OpLimits(frozenset({"float16", "bfloat16"}), frozenset({16, 32, 64, 128, 256, 512}), page_multiple=64),
    varlen=OpLimits(frozenset({"float16", "bfloat16"}), frozenset(range(8, 257, 8))),
)


def op_for(kind: str) -> str:
    if kind not in STEP_KINDS:
        raise ValueError(f"unknown step kind {kind!r}; one of {', '.join(STEP_KINDS)}")
    return DECODE_OP if kind == DECODE else VARLEN_OP


def step_refusal(kind: str, block_size: int, dtype, head_dim: Optional[int], limits: XformersLimits) -> Optional[str]:
    """Why xformers has no kernel for this kind of step with this configuration (one line), or None.
    head_dim None (not known yet) skips that check."""
    op = op_for(kind)
    lim = limits.decode if kind == DECODE else limits.varlen
    dtype = dtype_name(dtype)
    if not lim.takes_bias:
        return f"xformers' {op} does not take a {DECODE_BIAS if kind == DECODE else VARLEN_BIAS} ({kind} steps)"
    if dtype not in lim.dtypes:
        return (f"engine.dtype={dtype}: xformers' {op} ({kind} steps) runs only "
                f"{' or '.join(sorted(lim.dtypes))}")
    if head_dim is not None and head_dim not in lim.head_dims:
        return (f"head dim {head_dim}: xformers' {op} ({kind} steps) takes head dims "
                f"{_describe_dims(lim.head_dims)}")
    if lim.page_multiple and block_size % lim.page_multiple:
        return (f"engine.block_size={block_size}: xformers' {op} ({kind} steps) reads pages in tiles of "
                f"{lim.page_multiple} tokens (BLOCK_N), so the block size must be a multiple of {lim.page_multiple}")
    return None


def plan(kind: str, block_size: int, dtype, head_dim: int,
         limits: XformersLimits) -> Tuple[Optional[str], Optional[str]]:
    """(op name, None) when xformers can run this kind of step, else (None, why)."""
    why = step_refusal(kind, block_size, dtype, head_dim, limits)
    return (None, why) if why else (op_for(kind), None)


def config_refusal(block_size: int, dtype, head_dim: Optional[int], limits: XformersLimits) -> Optional[str]:
    """Why attention_backend=xformers cannot serve an engine at all (every step kind must run)."""
    for kind in STEP_KINDS:
        why = step_refusal(kind, block_size, dtype, head_dim, limits)
        if why:
            return why
    return None


def _describe_dims(dims: FrozenSet[int]) -> str:
    ordered = sorted(dims)
    if not ordered:
        return "none"
    if ordered == list(range(ordered[0], ordered[-1] + 1, HEAD_DIM_ALIGN)):
        return f"multiples of {HEAD_DIM_ALIGN} from {ordered[0]} to {ordered[-1]}"
    return ", ".join(map(str, ordered))
