"""Paged attention: write this step's K/V into the per-layer pool, then attend over each sequence's
blocks. Backends: `torch` (any device), `cpu` (torch plus our AVX2 decode kernel) and `xformers` (CUDA,
fp16/bf16; `xformers_attention.py`); the engine's kernel plan names one (kernel_plan.py, by the rule in
attention_select.py). Each backend's `prepare` builds, once per step, what its layers share
(StepContext.attn_meta); `forward` runs one layer."""
from typing import Optional

import torch
import torch.nn.functional as F

from appliance.engine import cpu_kernels
from appliance.engine.context import DECODE_GROUP_SIZE, StepContext, StepInput


class TorchAttentionBackend:
    """Reference backend on torch SDPA: decodes batched with a padding mask, prefills one by one."""

    name = "torch"
    decode_group_size: Optional[int] = DECODE_GROUP_SIZE  # decodes of similar length padded together

    def __init__(self):
        self.scratch = {}  # reused gather buffers: fresh multi-MB tensors each layer cost page faults

    def prepare(self, step: StepInput, ctx: StepContext):
        """Once per step, for the chunks that attend to cached K/V (later chunks, prefix-cache hits):
        their block ids and causal-offset masks, {sequence index: (blocks, mask)}."""
        chunks = {}
        device = ctx.positions.device
        for i, (q_len, ctx_len) in enumerate(zip(ctx.query_lens, ctx.context_lens)):
            if 1 < q_len < ctx_len:
                blocks = torch.tensor(ctx.block_tables[i][: -(-ctx_len // ctx.block_size)], device=device)
                # Query j sits at position ctx_len - q_len + j and sees the keys up to it.
                qpos = torch.arange(ctx_len - q_len, ctx_len, device=device)
                chunks[i] = (blocks, torch.arange(ctx_len, device=device)[None, :] <= qpos[:, None])
        return chunks

    def forward(self, q, k, v, k_cache, v_cache, ctx: StepContext, scale: float) -> torch.Tensor:
        """q: [T, Hq, D]; k/v: [T, Hk, D] (this step's, already in the cache);
        caches: [num_blocks, block_size, Hk, D]. Returns [T, Hq, D]."""
        bs = ctx.block_size
        if len(ctx.decode_groups) == 1 and ctx.decode_groups[0].all_rows:  # a decode-only step
            return self._decode(q, k_cache, v_cache, ctx.decode_groups[0], bs, scale)
        out = torch.empty_like(q)
        for group in ctx.decode_groups:
            out[group.rows] = self._decode(q[group.rows], k_cache, v_cache, group, bs, scale)
        for i, q_len in enumerate(ctx.query_lens):
            if q_len == 1:
                continue
            ctx_len, start = ctx.context_lens[i], ctx.query_start[i]
            # 4-D [1, H, L, D] throughout: torch runs 3-D inputs on its slower math kernel on CPU.
            qs = q[start:start + q_len].transpose(0, 1)[None]
            if q_len == ctx_len:  # whole prompt in this step: its K/V are this step's rows, no gather
                ks, vs = k[start:start + q_len].transpose(0, 1)[None], v[start:start + q_len].transpose(0, 1)[None]
                o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True)
            else:
                blocks, mask = ctx.attn_meta[i]
                ks = k_cache.index_select(0, blocks).flatten(0, 1)[:ctx_len].transpose(0, 1)[None]  # [1, Hk, L, D]
                vs = v_cache.index_select(0, blocks).flatten(0, 1)[:ctx_len].transpose(0, 1)[None]
                o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=True)
            out[start:start + q_len] = o[0].transpose(0, 1)
        return out

    def _gather(self, name: str, cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
        n = blocks.numel()
        buf = self.scratch.get(name)
        if buf is None or buf.shape[0] < n or buf.dtype != cache.dtype or buf.device != cache.device:
            buf = self.scratch[name] = torch.empty((max(n, 64),) + cache.shape[1:], dtype=cache.dtype,
                                                   device=cache.device)
        return torch.index_select(cache, 0, blocks, out=buf[:n])

    def _decode(self, q, k_cache, v_cache, group, block_size: int, scale: float) -> torch.Tensor:
        """One query per sequence, batched: gather each table (padded with block 0) and mask the pad."""
        n, width = group.block_tables.shape
        length = width * block_size
        blocks = group.block_tables.flatten()
        k = self._gather("k", k_cache, blocks).view(n, length, *k_cache.shape[2:]).transpose(1, 2)
        v = self._gather("v", v_cache, blocks).view(n, length, *v_cache.shape[2:]).transpose(1, 2)
        mask = torch.arange(length, device=q.device) < group.context_lens[:, None]
        o = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=mask[:, None, None, :],
                                           scale=scale, enable_gqa=True)
        return o.squeeze(2)


class CpuAttentionBackend(TorchAttentionBackend):
    """fp32 or bf16 on CPU: decodes read the paged K/V in place with our kernel (no gathered, padded
    copy); prefills as in the torch backend."""

    name = "cpu"
    decode_group_size = None  # no padding to limit: one call for all of a step's decodes

    def _decode(self, q, k_cache, v_cache, group, block_size: int, scale: float) -> torch.Tensor:
        if not cpu_kernels.handles_paged_decode(q, k_cache):
            return super()._decode(q, k_cache, v_cache, group, block_size, scale)
        return cpu_kernels.paged_decode_attention(q, k_cache, v_cache, group.block_tables,
                                                  group.context_lens, scale)


class PagedAttention(cpu_kernels.KernelLayer):
    """One layer's attention over the paged KV pool. The model runner assigns `k_cache`/`v_cache`; where
    its kernel plan says so (`use_in`), this step's K/V are written by our kernel."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, backend):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.backend = backend
        self.k_cache: Optional[torch.Tensor] = None  # [num_blocks, block_size, Hk, D]
        self.v_cache: Optional[torch.Tensor] = None

    def forward(self, q, k, v, ctx: StepContext) -> torch.Tensor:
        """q: [T, Hq*D], k/v: [T, Hk*D] -> [T, Hq*D]."""
        k_cache, v_cache = self.k_cache, self.v_cache
        if k_cache is None or v_cache is None:
            raise RuntimeError("attention ran before the model runner assigned its k_cache and v_cache")
        t = q.shape[0]
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        if (self.use_cpu_kernels and cpu_kernels.fits(k, v, k_cache)
                and k.stride(1) == v.stride(1) == self.head_dim):
            cpu_kernels.write_kv(k, v, ctx.slot_mapping, k_cache, v_cache)
        else:
            k_cache.view(-1, self.num_kv_heads, self.head_dim)[ctx.slot_mapping] = k
            v_cache.view(-1, self.num_kv_heads, self.head_dim)[ctx.slot_mapping] = v
        return self.backend.forward(q, k, v, k_cache, v_cache, ctx, self.scale).reshape(t, -1)
