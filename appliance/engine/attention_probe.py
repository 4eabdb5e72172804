"""A start-up check that an attention backend runs every kind of step of this engine: one tiny forward
of each kind (decode, prefill, mixed) through the backend and through the torch backend on the same
K/V pool, compared. Kernel libraries decide at call time whether they have a kernel (and on a GPU the
answer depends on the card, the torch build and the wheels), so this is asked before any request."""
from typing import Dict, List, Optional, Tuple

import torch

from appliance.engine.attention import TorchAttentionBackend
from appliance.engine.attention_geometry import AttentionGeometry
from appliance.engine.context import StepContext, StepInput


def _pool_blocks(seqs, block_size: int) -> int:
    return 1 + sum(-(-ctx_len // block_size) for ctx_len, _ in seqs)


def _step(seqs: List[Tuple[int, int]], block_size: int) -> StepInput:
    """seqs: (context length after the step, new tokens) per sequence. Blocks are handed out from the
    top of the pool down, so tables are not in pool order; block 0 stays free (padding reads it)."""
    step = StepInput([], [], [], [], [], [], [])
    next_block = _pool_blocks(seqs, block_size) - 1
    for ctx_len, q_len in seqs:
        n = -(-ctx_len // block_size)
        table = list(range(next_block, next_block - n, -1))
        next_block -= n
        positions = range(ctx_len - q_len, ctx_len)
        step.input_ids += [0] * q_len
        step.positions += positions
        step.slot_mapping += [table[p // block_size] * block_size + p % block_size for p in positions]
        step.query_lens.append(q_len)
        step.context_lens.append(ctx_len)
        step.block_tables.append(table)
        step.sample_rows.append(len(step.input_ids) - 1)
    return step


def probe_steps(block_size: int) -> Dict[str, StepInput]:
    """One small step of each kind; tables of different widths, in scattered blocks."""
    bs = block_size
    return {
        "decode": _step([(3, 1), (bs + 2, 1)], bs),
        "prefill": _step([(5, 5), (3, 3)], bs),
        # a decode beside a chunk that follows a cached block (chunked prefill or a prefix-cache hit)
        "mixed": _step([(7, 1), (bs + 4, 6)], bs),
    }


def probe_backend(backend, geometry: AttentionGeometry, device: torch.device, dtype: torch.dtype,
                  atol: Optional[float] = None) -> Optional[str]:
    """None if `backend` runs every kind of step and agrees with the torch backend, else why not
    (the first failing kind and the error's first line)."""
    if atol is None:
        atol = 1e-4 if dtype == torch.float32 else 3e-2
    reference = TorchAttentionBackend()
    for kind, step in probe_steps(geometry.block_size).items():
        try:
            with torch.inference_mode():
                got, want = (_run(b, step, geometry, device, dtype) for b in (backend, reference))
                err = (got.float() - want.float()).abs().max().item()
        except Exception as e:  # noqa: BLE001 - the kernel library's refusal or failure, whatever its type
            lines = [line.strip() for line in str(e).splitlines() if line.strip()]
            return f"{kind} step failed: {type(e).__name__}: {' | '.join(lines[:3])}"
        if not err <= atol:
            return f"{kind} step: output differs from the torch backend's by {err:.3g} (> {atol})"
    return None


def _run(backend, step: StepInput, g: AttentionGeometry, device, dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)  # same K/V for both backends; the global RNG is untouched

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    t, blocks = len(step.input_ids), 1 + max(max(table) for table in step.block_tables)
    k_cache = randn(blocks, g.block_size, g.num_kv_heads, g.head_dim)
    v_cache = randn(blocks, g.block_size, g.num_kv_heads, g.head_dim)
    # q/k/v as the layers see them: views into one fused projection (rows not contiguous).
    fused = randn(t, g.num_heads + 2 * g.num_kv_heads, g.head_dim)
    q, k, v = fused.split([g.num_heads, g.num_kv_heads, g.num_kv_heads], dim=1)
    slots = torch.tensor(step.slot_mapping, device=device)
    k_cache.view(-1, g.num_kv_heads, g.head_dim)[slots] = k
    v_cache.view(-1, g.num_kv_heads, g.head_dim)[slots] = v
    ctx = StepContext.build(step, g.block_size, device, getattr(backend, "decode_group_size", None))
    ctx.attn_meta = backend.prepare(step, ctx)
    return backend.forward(q, k, v, k_cache, v_cache, ctx, g.head_dim ** -0.5)
