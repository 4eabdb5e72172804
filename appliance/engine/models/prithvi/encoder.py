"""Prithvi-EO ViT encoder: 3D patch embedding, fixed sin-cos positions, optional time/location encodings.

Module and parameter names follow terratorch's `PrithviViT` so that its checkpoints load unchanged
(`patch_embed.proj`, `pos_embed`, `cls_token`, `blocks.N.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2}`,
`norm`, `temporal_embed_enc.scale`, `location_embed_enc.scale`).
"""
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .posembed import resize_pos_table, sincos_1d_torch, sincos_3d_table

LAYER_NORM_EPS = 1e-5


class PatchEmbed(nn.Module):
    """[B, C, T, H, W] -> [B, T'*H'*W', D]: a Conv3d of kernel = stride = (tubelet, patch, patch), as the
    checkpoints store it, computed as one matmul over the flattened patches. Same result; and oneDNN's
    bf16 Conv3d on AMX CPUs returns garbage for this shape (error as large as the output), its matmul
    does not."""

    def __init__(self, in_chans: int, embed_dim: int, patch_size: Tuple[int, int, int]):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv3d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t, h, w = x.shape
        pt, ph, pw = self.patch_size
        nt, nh, nw = t // pt, h // ph, w // pw  # a conv with stride = kernel drops any remainder too
        x = x[:, :, :nt * pt, :nh * ph, :nw * pw].reshape(b, c, nt, pt, nh, ph, nw, pw)
        patches = x.permute(0, 2, 4, 6, 1, 3, 5, 7).reshape(b, nt * nh * nw, c * pt * ph * pw)
        return F.linear(patches, self.proj.weight.reshape(self.proj.out_channels, -1), self.proj.bias)


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"embed_dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, d // self.num_heads).permute(2, 0, 3, 1, 4)
        x = F.scaled_dot_product_attention(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(b, n, d))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()  # exact (erf) GELU
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm1(x)), then x + mlp(norm2(x))."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=LAYER_NORM_EPS)
        self.attn = Attention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim, eps=LAYER_NORM_EPS)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class CoordsScale(nn.Module):
    """Holds the scale of a coordinate encoding: learned (init 0.1) or a fixed buffer of 1."""

    def __init__(self, learn: bool):
        super().__init__()
        if learn:
            self.scale = nn.Parameter(torch.full((1,), 0.1))
        else:
            self.register_buffer("scale", torch.ones(1))


class TemporalEncoder(CoordsScale):
    """(year, day-of-year) per frame [B, T, 2] -> scale * [sincos(year) | sincos(doy)], [B, T, D]."""

    def __init__(self, embed_dim: int, learn_scale: bool):
        super().__init__(learn_scale)
        self.year_dim = embed_dim // 2
        self.doy_dim = embed_dim - self.year_dim

    def forward(self, coords: torch.Tensor) -> torch.Tensor:
        b, t = coords.shape[:2]
        year = sincos_1d_torch(self.year_dim, coords[:, :, 0]).reshape(b, t, -1)
        doy = sincos_1d_torch(self.doy_dim, coords[:, :, 1]).reshape(b, t, -1)
        return self.scale * torch.cat([year, doy], dim=-1)


class LocationEncoder(CoordsScale):
    """(lat, lon) [B, 2] -> scale * [sincos(lat) | sincos(lon)], [B, 1, D]. Latitude comes first."""

    def __init__(self, embed_dim: int, learn_scale: bool):
        super().__init__(learn_scale)
        self.lat_dim = embed_dim // 2
        self.lon_dim = embed_dim - self.lat_dim

    def forward(self, coords: torch.Tensor) -> torch.Tensor:
        b = coords.shape[0]
        lat = sincos_1d_torch(self.lat_dim, coords[:, 0]).reshape(b, 1, -1)
        lon = sincos_1d_torch(self.lon_dim, coords[:, 1]).reshape(b, 1, -1)
        return self.scale * torch.cat([lat, lon], dim=-1)


class PrithviViT(nn.Module):
    """Encoder returning the token sequences [B, 1 + T'H'W', D] after the requested blocks.

    As in the reference, only the output of the *last* block goes through the final LayerNorm; blocks
    after the deepest requested one are skipped (their outputs could not change the result).
    """

    pos_embed: torch.Tensor  # buffer: the fixed sin-cos table [1, 1 + T'H'W', D] of `base_grid`

    def __init__(
        self,
        in_chans: int,
        embed_dim: int,
        depth: int,
        num_heads: int,
        patch_size: int,
        tubelet_size: int = 1,
        num_frames: int = 1,
        img_size: int = 224,
        mlp_ratio: float = 4.0,
        coords_encoding: Sequence[str] = (),
        coords_scale_learn: bool = False,
    ):
        super().__init__()
        unknown = set(coords_encoding) - {"time", "location"}
        if unknown:
            raise ValueError(f"coords_encoding may contain 'time' and 'location', got {sorted(unknown)}")
        if "time" in coords_encoding and tubelet_size != 1:
            raise ValueError(f"temporal encoding needs tubelet_size 1, got {tubelet_size}")
        self.embed_dim = embed_dim
        self.depth = depth
        self.num_frames = num_frames
        self.patch_size = (tubelet_size, patch_size, patch_size)
        self.base_grid = (num_frames // tubelet_size, img_size // patch_size, img_size // patch_size)
        if min(self.base_grid) < 1:
            raise ValueError(f"patch {self.patch_size} is larger than the input {num_frames}x{img_size}x{img_size}")
        self.patch_embed = PatchEmbed(in_chans, embed_dim, self.patch_size)
        if "time" in coords_encoding:
            self.temporal_embed_enc = TemporalEncoder(embed_dim, coords_scale_learn)
        if "location" in coords_encoding:
            self.location_embed_enc = LocationEncoder(embed_dim, coords_scale_learn)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        # Fixed, but persistent so that the state dict matches the reference's key set.
        self.register_buffer("pos_embed", sincos_3d_table(embed_dim, self.base_grid))
        self.blocks = nn.ModuleList(Block(embed_dim, num_heads, mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(embed_dim, eps=LAYER_NORM_EPS)

    @property
    def out_channels(self) -> int:
        """Channels of one block's output once reshaped to an image: embed_dim per encoded frame."""
        return self.embed_dim * self.base_grid[0]

    def token_grid(self, x: torch.Tensor) -> Tuple[int, int, int]:
        """(T', H', W') token grid for a [B, C, T, H, W] input."""
        t, h, w = x.shape[-3:]
        pt, ph, pw = self.patch_size
        return t // pt, h // ph, w // pw

    def forward(
        self,
        x: torch.Tensor,
        indices: Sequence[int],
        temporal_coords: Optional[torch.Tensor] = None,
        location_coords: Optional[torch.Tensor] = None,
    ) -> List[torch.Tensor]:
        """x: [B, C, T, H, W]; returns the outputs of blocks `indices` (non-negative, any order)."""
        grid = self.token_grid(x)
        pos = resize_pos_table(self.pos_embed, self.base_grid, grid)
        tokens = self.patch_embed(x) + pos[:, 1:]
        # Coordinate encodings are computed in float32 (a year of 2018 is meaningless in bfloat16).
        if temporal_coords is not None and hasattr(self, "temporal_embed_enc"):
            # The reference splits tokens by the configured frame count, not the input's.
            per_frame = tokens.shape[1] // self.num_frames
            enc = self.temporal_embed_enc(temporal_coords.float()).to(tokens.dtype)
            tokens = tokens + torch.repeat_interleave(enc, per_frame, dim=1)
        if location_coords is not None and hasattr(self, "location_embed_enc"):
            tokens = tokens + self.location_embed_enc(location_coords.float()).to(tokens.dtype)
        cls = (self.cls_token + pos[:, :1]).expand(tokens.shape[0], -1, -1)
        h = torch.cat([cls, tokens], dim=1)

        wanted = set(indices)
        outputs = {}
        for i, block in enumerate(self.blocks[: max(wanted) + 1]):
            h = block(h)
            if i in wanted:
                outputs[i] = self.norm(h) if i == self.depth - 1 else h
        return [outputs[i] for i in indices]
