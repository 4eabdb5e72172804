"""The xformers attention backend (CUDA, fp16/bf16): one kernel per kind of step, each one that
xformers 0.0.35 has without extra wheels (`xformers_plan.py`; the facts in docs/engine.md).

`prepare` builds everything the layers share once per step (the masks, with their sequence-length
tensors, the padded block table, the gather index); `forward` only views and indexes tensors.
"""
from dataclasses import dataclass
from typing import Any, Optional

import torch

from appliance.engine.context import StepContext, StepInput
from appliance.engine.xformers_plan import DECODE, DECODE_BIAS, MIXED, PREFILL, VARLEN_BIAS


@dataclass
class XformersStep:
    kind: str
    bias: Any  # an xformers attention bias, built on the model's device
    kv_rows: Optional[torch.Tensor] = None  # mixed steps: pool rows of every sequence's keys, packed


def key_rows(block_tables, context_lens, block_size: int, device) -> torch.Tensor:
    """Rows of the flattened pool ([num_blocks * block_size]) holding each sequence's first
    context_len keys, sequences one after another. Built on the device from two small copies."""
    width = max(len(t) for t in block_tables)
    tables = torch.tensor([t + [0] * (width - len(t)) for t in block_tables], dtype=torch.long, device=device)
    lens = torch.tensor(context_lens, dtype=torch.long, device=device)
    total = sum(context_lens)
    seq = torch.repeat_interleave(torch.arange(len(context_lens), device=device), lens, output_size=total)
    pos = torch.arange(total, device=device) - (torch.cumsum(lens, 0) - lens)[seq]
    return tables[seq, pos // block_size] * block_size + pos % block_size


class XformersAttentionBackend:
    """Decode steps: `triton_splitk.FwOp` on the paged pool in place. Prefill steps: `flash.FwOp` on
    this step's keys. Mixed steps: `flash.FwOp` on keys gathered from the pool (cached + new)."""

    name = "xformers"
    decode_group_size = 0  # no decode groups in the StepContext: `prepare` builds what this backend reads

    def __init__(self, fmha=None):
        if fmha is None:
            from xformers.ops import fmha as xformers_fmha  # optional, CUDA-only dependency (the `gpu` extra)
            fmha = xformers_fmha
        self.fmha = fmha
        self.ops = {DECODE: fmha.triton_splitk.FwOp, PREFILL: fmha.flash.FwOp, MIXED: fmha.flash.FwOp}

    def prepare(self, step: StepInput, ctx: StepContext) -> XformersStep:
        bias_types, device = self.fmha.attn_bias, ctx.positions.device
        if ctx.kind == DECODE:
            width = max(len(t) for t in step.block_tables)
            tables = torch.tensor([t + [0] * (width - len(t)) for t in step.block_tables], dtype=torch.int32,
                                  device=device)
            bias = getattr(bias_types, DECODE_BIAS).from_seqlens(
                q_seqlen=step.query_lens, kv_seqlen=step.context_lens, block_tables=tables,
                page_size=ctx.block_size, device=device)
            return XformersStep(DECODE, bias)
        # Query j of a sequence sits at position context_len - query_len + j: causal from the bottom right.
        bias = getattr(bias_types, VARLEN_BIAS).from_seqlens(step.query_lens, step.context_lens, device=device)
        if ctx.kind == PREFILL:
            return XformersStep(PREFILL, bias)
        return XformersStep(MIXED, bias, key_rows(step.block_tables, step.context_lens, ctx.block_size, device))

    def forward(self, q, k, v, k_cache, v_cache, ctx: StepContext, scale: float) -> torch.Tensor:
        """q: [T, Hq, D]; k/v: [T, Hk, D] (already in the pool); pool: [num_blocks, block_size, Hk, D]."""
        meta: XformersStep = ctx.attn_meta
        t, hq, d = q.shape
        hk = k_cache.shape[2]
        if meta.kind == DECODE:
            keys, values = k_cache.view(1, -1, hk, 1, d), v_cache.view(1, -1, hk, 1, d)
        elif meta.kind == PREFILL:
            keys, values = k.view(1, t, hk, 1, d), v.view(1, t, hk, 1, d)
        else:
            keys = k_cache.view(-1, hk, d).index_select(0, meta.kv_rows).view(1, -1, hk, 1, d)
            values = v_cache.view(-1, hk, d).index_select(0, meta.kv_rows).view(1, -1, hk, 1, d)
        # Grouped layout [1, L, Hk, Hq/Hk, D] covers GQA: K/V are expanded (stride 0), never copied.
        group = hq // hk
        out = self.fmha.memory_efficient_attention_forward(
            q.view(1, t, hk, group, d), keys.expand(-1, -1, -1, group, -1), values.expand(-1, -1, -1, group, -1),
            attn_bias=meta.bias, scale=scale, op=self.ops[meta.kind])
        return out.view(t, hq, d)
