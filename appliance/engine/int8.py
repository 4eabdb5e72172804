"""int8 weight-only quantization of linear layers (`engine.quantization: int8`).

Each weight row (output channel) is scaled symmetrically into int8 at load: w ≈ q · scale, with
q in [-127, 127] and scale = max|w_row| / 127. Activations stay in half precision. Decoding reads the
weights once per token, so halving their bytes (against bf16) is what makes a memory-bound decode
faster; the multiply is torch's `_weight_int8pack_mm` (int8 weights, bf16 activations, per-row
scales). Past `ONE_STREAM_ROWS` rows a step is compute-bound, and on hosts whose bf16 GEMM has matrix
units (AMX) a dense GEMM on weights dequantised tile by tile beats it.
"""
from typing import Optional

import torch

ONE_STREAM_ROWS = 16  # rows (tokens) a step up to which the int8 kernel runs; past it, dequantised tiles
TILE_ROWS = 1024  # weight rows dequantised at a time (a few MB of bf16: stays in cache)
QUANT_CHUNK_ROWS = 256  # weight rows quantised at a time: their fp32 copy (~11 MB at 11008 wide) stays in cache


class Int8Weight:
    """A [N, K] weight as int8 rows and their N scales."""

    def __init__(self, weight: torch.Tensor):
        rows = weight.shape[0]
        self.q = torch.empty(weight.shape, dtype=torch.int8, device=weight.device)
        self.scale = torch.empty(rows, dtype=torch.float32, device=weight.device)
        for start in range(0, rows, QUANT_CHUNK_ROWS):
            chunk = weight[start:start + QUANT_CHUNK_ROWS].float()
            scale = chunk.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / 127
            self.q[start:start + QUANT_CHUNK_ROWS] = torch.round(chunk / scale[:, None]).clamp_(-127, 127)
            self.scale[start:start + QUANT_CHUNK_ROWS] = scale

    @property
    def nbytes(self) -> int:
        return self.q.numel() + self.scale.numel() * self.scale.element_size()

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.q.to(torch.float32) * self.scale[:, None]).to(dtype)

    def linear(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x Wᵀ (+ bias) for x [..., K], in x's dtype; computed with bf16 activations on the CPU."""
        shape, dtype = x.shape, x.dtype
        x2 = x.reshape(-1, shape[-1])
        compute = torch.bfloat16 if x.device.type == "cpu" else dtype
        x2 = x2.to(compute)
        if x2.shape[0] <= ONE_STREAM_ROWS:
            y = torch.ops.aten._weight_int8pack_mm(x2, self.q, self.scale.to(compute))
        else:
            y = torch.empty(x2.shape[0], self.q.shape[0], dtype=compute, device=x.device)
            for start in range(0, self.q.shape[0], TILE_ROWS):
                tile = self.q[start:start + TILE_ROWS].to(compute) * self.scale[start:start + TILE_ROWS, None].to(compute)
                torch.mm(x2, tile.t(), out=y[:, start:start + TILE_ROWS])
        y = y.to(dtype).reshape(*shape[:-1], self.q.shape[0])
        return y if bias is None else y + bias


def kernel_problem(device: torch.device, kernel=None) -> Optional[str]:
    """Why int8 weights cannot run on `device` (None: they can): probes the kernel once with a tiny call."""
    kernel = kernel or torch.ops.aten._weight_int8pack_mm
    compute = torch.bfloat16 if device.type == "cpu" else torch.float16
    try:
        x = torch.ones(1, 64, dtype=compute, device=device)
        q = torch.ones(8, 64, dtype=torch.int8, device=device)
        kernel(x, q, torch.ones(8, dtype=compute, device=device))
    except (RuntimeError, NotImplementedError) as e:
        return f"torch has no int8 weight kernel on {device.type} ({str(e).splitlines()[0][:120]})"
    return None
