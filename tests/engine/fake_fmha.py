"""`xformers.ops.fmha` for CPU tests: the ops' declared limits, the two masks our backend builds, and
`memory_efficient_attention_forward` as dense math over the mask's `materialize`.

`reference_fmha()` uses the installed xformers wherever it runs on CPU: its mask classes (their own
`materialize`, i.e. xformers' semantics of pages and offsets), its op classes, its input validation
and each op's `not_supported_reasons` (less the reasons that only say "not on a GPU"); only the kernel
is replaced. Without xformers it falls back to `FakeFmha`, which mirrors 0.0.35's declarations
(ops/fmha/triton_splitk.py, flash.py, attn_bias.py at tag v0.0.35).
"""
import dataclasses
import importlib.util
import math
from types import SimpleNamespace

import torch

HALF = {torch.float16, torch.bfloat16}
# Reasons an op gives only because these tensors are on the CPU (or the kernel is not built here).
CPU_ONLY_REASONS = ("device=", "operator wasn't built", "bf16 is only supported", "triton is not available",
                    "xFormers wasn't build")


def _starts(lens):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return out


class PagedBlockDiagonalPaddedKeysMask:
    """Query block i sees the first kv_seqlen[i] keys of sequence i, read through its block table."""

    def __init__(self, q_seqlen, kv_seqlen, block_tables, page_size):
        self.q_seqlen, self.kv_seqlen = list(q_seqlen), list(kv_seqlen)
        self.block_tables, self.page_size = block_tables, page_size

    @classmethod
    def from_seqlens(cls, q_seqlen, kv_seqlen, block_tables, page_size, *, device=None):
        assert block_tables.dtype == torch.int32 and block_tables.shape[0] == len(q_seqlen)
        return cls(q_seqlen, kv_seqlen, block_tables, page_size)

    def materialize(self, shape, dtype=torch.float32, device="cpu"):
        """shape: (queries, logical keys); as in xformers, the result spans the pool's keys up to the
        highest page in the tables."""
        physical = (int(self.block_tables.max()) + 1) * self.page_size
        mask = torch.full((shape[0], physical), -math.inf, dtype=dtype, device=device)
        qs = _starts(self.q_seqlen)
        for b, kv_len in enumerate(self.kv_seqlen):
            for p in range(kv_len):
                row = int(self.block_tables[b, p // self.page_size]) * self.page_size + p % self.page_size
                mask[qs[b]:qs[b + 1], row] = 0
        return mask


class BlockDiagonalCausalFromBottomRightMask:
    """Query j of block i (of q_len) sees keys 0 .. kv_len - q_len + j of block i."""

    def __init__(self, q_seqlen, kv_seqlen):
        assert all(k >= q for q, k in zip(q_seqlen, kv_seqlen)), "num_keys >= num_queries per block"
        self.q_seqlen, self.kv_seqlen = list(q_seqlen), list(kv_seqlen)

    @classmethod
    def from_seqlens(cls, q_seqlen, kv_seqlen=None, *, device=None):
        return cls(q_seqlen, kv_seqlen if kv_seqlen is not None else q_seqlen)

    def materialize(self, shape, dtype=torch.float32, device="cpu"):
        mask = torch.full(shape, -math.inf, dtype=dtype, device=device)
        qs, ks = _starts(self.q_seqlen), _starts(self.kv_seqlen)
        for b, (q_len, kv_len) in enumerate(zip(self.q_seqlen, self.kv_seqlen)):
            for j in range(q_len):
                mask[qs[b] + j, ks[b]:ks[b] + kv_len - q_len + j + 1] = 0
        return mask


class _Op:
    SUPPORTED_DTYPES = HALF
    SUPPORTED_MAX_K = 256

    @classmethod
    def shape_not_supported_reasons(cls, Mq, Mkv, K, Kv):
        too_big = max(K, Kv) > cls.SUPPORTED_MAX_K
        return [f"max(query.shape[-1], value.shape[-1]) > {cls.SUPPORTED_MAX_K}"] if too_big else []


class SplitKFwOp(_Op):
    NAME = "triton_splitKF"
    BLOCK_N = 64
    SUPPORTED_MAX_K = 512
    SUPPORTED_ATTN_BIAS_TYPES = (type(None), PagedBlockDiagonalPaddedKeysMask)

    @classmethod
    def shape_not_supported_reasons(cls, Mq, Mkv, K, Kv):
        return super().shape_not_supported_reasons(Mq, Mkv, K, Kv) + (
            [] if K in {16, 32, 64, 128, 256, 512} else [f"Embed dim {K} not supported"])


class FlashFwOp(_Op):
    NAME = "fa2F@0.0.0-pt"
    SUPPORTED_ATTN_BIAS_TYPES = (type(None), BlockDiagonalCausalFromBottomRightMask)


def dense_attention(q, k, v, bias, scale):
    """q: [1, Mq, G, H, D], k/v: [1, Mk, G, H, D] -> softmax(q k^T * scale + mask) v, in fp32."""
    mq, mk = q.shape[1], k.shape[1]
    tables = getattr(bias, "block_tables", None)
    # A paged mask is materialized from its logical shape (every table padded to the widest) and
    # comes back as wide as the pool up to its highest page.
    mask = bias.materialize((mq, tables.numel() * bias.page_size if tables is not None else mk))[:, :mk]
    if mask.shape[-1] < mk:  # a paged mask covers the pool only up to its highest used page
        mask = torch.cat([mask, mask.new_full((mq, mk - mask.shape[-1]), -math.inf)], dim=-1)
    scores = torch.einsum("qghd,kghd->ghqk", q[0].float(), k[0].float()) * scale + mask
    out = torch.einsum("ghqk,kghd->qghd", scores.softmax(-1), v[0].float())
    return out[None].to(q.dtype)


def _forward_checked_by(fmha, allow_fp32: bool):
    from xformers.ops.fmha import common

    def forward(query, key, value, attn_bias=None, scale=None, *, op):
        inp = common.Inputs(query=query, key=key, value=value, attn_bias=attn_bias, scale=scale)
        inp.validate_inputs()
        allowed = CPU_ONLY_REASONS + (("dtype=torch.float32",) if allow_fp32 else ())
        reasons = [r for r in op.not_supported_reasons(inp) if not any(a in r for a in allowed)]
        assert not reasons, f"{op.NAME} refuses these inputs: {reasons}"
        if isinstance(attn_bias, fmha.attn_bias.PagedBlockDiagonalPaddedKeysMask):
            attn_bias = _padding_past_the_pool(attn_bias, key.shape[1] // attn_bias.page_size)
        return dense_attention(query, key, value, attn_bias, scale)
    return forward


def _padding_past_the_pool(bias, pool_pages: int):
    """xformers' `materialize` copies every table entry, padding too: a padded entry naming a page in
    use would overwrite that page's columns with -inf. The kernel never reads past a sequence's keys,
    so for the dense reference padding names a page past the pool (columns `dense_attention` drops)."""
    tables = bias.block_tables.clone()
    for b, kv_len in enumerate(bias.k_seqinfo.seqlen_py):
        tables[b, -(-kv_len // bias.page_size):] = pool_pages
    return dataclasses.replace(bias, block_tables=tables)


def _forward_checked_like_0_0_35(allow_fp32: bool):
    """The checks of 0.0.35 that these masks and shapes meet (a subset of the real ones)."""
    def forward(query, key, value, attn_bias=None, scale=None, *, op):
        assert query.ndim == key.ndim == value.ndim == 5 and key.shape == value.shape
        reasons = op.shape_not_supported_reasons(query.shape[1], key.shape[1], query.shape[-1], value.shape[-1])
        if type(attn_bias) not in op.SUPPORTED_ATTN_BIAS_TYPES:
            reasons.append(f"attn_bias type is {type(attn_bias)}")
        if query.dtype not in op.SUPPORTED_DTYPES and not (allow_fp32 and query.dtype == torch.float32):
            reasons.append(f"dtype={query.dtype}")
        if isinstance(attn_bias, PagedBlockDiagonalPaddedKeysMask) and attn_bias.page_size % op.BLOCK_N:
            reasons.append(f"page size should be divisible by the block size, got {attn_bias.page_size}")
        assert not reasons, f"{op.NAME} refuses these inputs: {reasons}"
        return dense_attention(query, key, value, attn_bias, scale)
    return forward


def fake_fmha(allow_fp32: bool = False):
    return SimpleNamespace(
        attn_bias=SimpleNamespace(PagedBlockDiagonalPaddedKeysMask=PagedBlockDiagonalPaddedKeysMask,
                                  BlockDiagonalCausalFromBottomRightMask=BlockDiagonalCausalFromBottomRightMask),
        triton_splitk=SimpleNamespace(FwOp=SplitKFwOp), flash=SimpleNamespace(FwOp=FlashFwOp),
        memory_efficient_attention_forward=_forward_checked_like_0_0_35(allow_fp32), real=False)


def real_xformers_fmha():
    """The installed `xformers.ops.fmha`, or None (not installed, or it fails to import beside this torch)."""
    if importlib.util.find_spec("xformers") is None:
        return None
    try:
        from xformers.ops import fmha
    except ImportError:
        return None
    return fmha


def reference_fmha(allow_fp32: bool = False):
    """Real xformers' masks, ops and checks with a dense kernel when importable, else `fake_fmha()`."""
    fmha = real_xformers_fmha()
    if fmha is None:
        return fake_fmha(allow_fp32)
    return SimpleNamespace(attn_bias=fmha.attn_bias, triton_splitk=fmha.triton_splitk, flash=fmha.flash,
                           memory_efficient_attention_forward=_forward_checked_by(fmha, allow_fp32), real=True)
