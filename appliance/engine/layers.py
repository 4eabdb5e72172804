"""Small building blocks of decoder models: RMSNorm, rotary embedding, SwiGLU activation. Each runs on
one of our CPU kernels once its engine's runner turns them on (`cpu_kernels.use_in`), else on torch."""
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from appliance.engine import cpu_kernels


class RMSNorm(cpu_kernels.KernelLayer):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_cpu_kernels and x.dim() == 2 and cpu_kernels.fits(x, self.weight):  # one op instead of eight
            return cpu_kernels.rms_norm(x, self.weight, self.eps)
        # Normalise in fp32, as the reference does, so bf16 runs do not lose precision here.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class SiluAndMul(cpu_kernels.KernelLayer):
    """SwiGLU: silu(gate) * up, with gate and up concatenated on the last dim."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_cpu_kernels and x.dim() == 2 and cpu_kernels.fits(x):
            return cpu_kernels.silu_mul(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


def rope_parameters(hf_config) -> dict:
    """rope settings from a HF config; transformers 5 uses `rope_parameters`, older ones `rope_scaling`."""
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    scaling = getattr(hf_config, "rope_scaling", None) or {}
    params = {**scaling, **params}
    params.setdefault("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    params["rope_type"] = params.get("rope_type", params.get("type", "default")) or "default"
    return params


def rope_inv_freq(head_dim: int, params: dict) -> torch.Tensor:
    base = params["rope_theta"]
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = params["rope_type"]
    if kind == "default":
        return inv_freq
    if kind == "linear":  # positions divided by factor == frequencies divided by factor
        return inv_freq / params["factor"]
    if kind == "llama3":
        factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
        old_len = params["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        # Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
        smooth = ((old_len / wavelen - low) / (high - low)).clamp(0.0, 1.0)
        scaled = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        return torch.where(wavelen > old_len / low, inv_freq / factor,
                           torch.where(wavelen < old_len / high, inv_freq, scaled))
    raise ValueError(f"rope_type {kind!r} is not supported; supported: default, linear, llama3 "
                     f"(dynamic NTK depends on the batch's length, which a batched engine cannot honour)")


class RotaryEmbedding(cpu_kernels.KernelLayer):
    """Neox-style rotary embedding (rotate the two halves), with a cos/sin table per position."""

    cos: torch.Tensor  # buffers: [max_positions, head_dim]
    sin: torch.Tensor

    def __init__(self, head_dim: int, max_positions: int, params: Optional[dict] = None):
        super().__init__()
        self.head_dim, self.max_positions = head_dim, max_positions
        self.params = params or {"rope_theta": 10000.0, "rope_type": "default"}
        cos, sin = self._tables()
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _tables(self):
        inv_freq = rope_inv_freq(self.head_dim, self.params)
        freqs = torch.outer(torch.arange(self.max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos(), emb.sin()

    def init_buffers(self) -> None:
        """The tables, computed in fp32 on the CPU into the buffers' storage (a model built on the meta
        device has storage but no values; engine/materialize.py)."""
        with torch.device("cpu"):
            cos, sin = self._tables()
        with torch.no_grad():
            self.cos.copy_(cos)
            self.sin.copy_(sin)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """q: [T, Hq, D], k: [T, Hk, D]; positions: [T]. With our CPU kernels q and k are rotated in place."""
        if self.use_cpu_kernels and cpu_kernels.fits(q, k, self.cos) and q.stride(1) == q.shape[2] \
                and k.stride(1) == k.shape[2]:
            cpu_kernels.rotary_(q, k, positions, self.cos, self.sin)
            return q, k
        cos = self.cos[positions].unsqueeze(1).to(q.dtype)
        sin = self.sin[positions].unsqueeze(1).to(q.dtype)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)
