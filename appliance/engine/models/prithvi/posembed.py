"""Fixed sin-cos encodings of Prithvi-EO: the 3D (t, h, w) position table and the 1D coordinate encodings.

The position table is built once for the pretraining grid (`img_size / patch` cells per side, 14x14 for
224/16) and, for any other grid, resized bicubically with `align_corners=True`, exactly as the reference
does. That resized table is *not* the table one would compute directly for the new grid (the two differ
by up to ~2.0), and the fine-tuned weights were trained against the resized one, so we reproduce it.
"""
from typing import Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F


def sincos_1d(dim: int, positions: np.ndarray) -> np.ndarray:
    """[M] positions -> [M, dim] as [sin(p * w_i) ..., cos(p * w_i) ...], w_i = 10000^(-2i/dim), float64."""
    if dim % 2:
        raise ValueError(f"sin-cos dimension must be even, got {dim}")
    omega = 1.0 / 10000 ** (np.arange(dim // 2, dtype=np.float64) / (dim / 2.0))
    angles = np.outer(positions.reshape(-1).astype(np.float64), omega)
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)


def sincos_1d_torch(dim: int, positions: torch.Tensor) -> torch.Tensor:
    """Torch version of `sincos_1d` in the dtype of `positions` (used for run-time coordinates)."""
    if dim % 2:
        raise ValueError(f"sin-cos dimension must be even, got {dim}")
    omega = torch.arange(dim // 2, dtype=positions.dtype, device=positions.device)
    omega = 1.0 / 10000 ** (omega / (dim / 2.0))
    angles = positions.reshape(-1, 1) * omega.reshape(1, -1)
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)


def sincos_3d_table(embed_dim: int, grid: Sequence[int]) -> torch.Tensor:
    """Position table [1, 1 + t*h*w, embed_dim] (float32) with a zero row for the CLS token.

    Channels are split 6/16 width, 6/16 height, 4/16 time, in that order; tokens are ordered (t, h, w).
    """
    if embed_dim % 16:
        raise ValueError(f"embed_dim must be a multiple of 16 for the 3D sin-cos table, got {embed_dim}")
    t, h, w = grid
    w_dim = h_dim = embed_dim // 16 * 6
    t_dim = embed_dim // 16 * 4
    tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
    table = np.concatenate(
        [sincos_1d(w_dim, ww.ravel()), sincos_1d(h_dim, hh.ravel()), sincos_1d(t_dim, tt.ravel())], axis=1
    )
    table = np.concatenate([np.zeros((1, embed_dim)), table], axis=0)
    return torch.from_numpy(table).float().unsqueeze(0)


def resize_pos_table(
    table: torch.Tensor, base_grid: Tuple[int, int, int], grid: Tuple[int, int, int]
) -> torch.Tensor:
    """The position table for token grid `grid`, derived from `table` (built for `base_grid`).

    A different frame count rebuilds the table at (t, base h, base w); a different spatial grid then
    resizes each frame's (base h, base w) plane bicubically with align_corners=True. Returns
    [1, 1 + t*h*w, D] in `table`'s dtype and device.
    """
    t, h, w = grid
    if tuple(grid) == tuple(base_grid):
        return table
    dim = table.shape[-1]
    if t != base_grid[0]:
        table = sincos_3d_table(dim, (t, base_grid[1], base_grid[2])).to(table.device, table.dtype)
    cls_row, patches = table[:, :1], table[:, 1:]
    planes = patches.reshape(t, base_grid[1], base_grid[2], dim).permute(0, 3, 1, 2)
    planes = F.interpolate(planes, size=(h, w), mode="bicubic", align_corners=True)
    patches = planes.permute(0, 2, 3, 1).reshape(1, t * h * w, dim)
    return torch.cat([cls_row, patches], dim=1)
