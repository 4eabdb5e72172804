"""Shaping of a segmentation model's input and output, the same for both neck/head layouts: frames
axis, the date-major reshape some checkpoints were trained with, reflect padding, centre crop; and
`TileSegmentation`, the forward that applies them around a layout's own network."""
from abc import ABC, abstractmethod
from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn


def as_frames(x: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] or [B, C, T, H, W] -> [B, C, T, H, W]."""
    if x.dim() == 4:
        x = x.unsqueeze(2)
    if x.dim() != 5:
        raise ValueError(f"expected [B, C, H, W] or [B, C, T, H, W], got shape {tuple(x.shape)}")
    return x


def date_major_reshape(x: torch.Tensor) -> torch.Tensor:
    """[B, C, T, H, W] (band c of date t) -> the same tiles as a date-major stack of T x C planes reshaped
    straight to [C, T]: what a model trained on such reshaped stacks saw (`PrithviConfig.date_major_reshape`)."""
    b, c, t, h, w = x.shape
    return x.transpose(1, 2).reshape(b, c, t, h, w)


def pad_amounts(size: int, multiple: int) -> Tuple[int, int]:
    """(before, after) padding that brings `size` to a multiple of `multiple`; the odd pixel goes after."""
    total = -size % multiple
    return total // 2, total - total // 2


def reflect_pad(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """Reflect-pad [B, C, T, H, W] so that H and W are multiples of `multiple`, split between both sides."""
    b, c, t, h, w = x.shape
    (top, bottom), (left, right) = pad_amounts(h, multiple), pad_amounts(w, multiple)
    if not (top or bottom or left or right):
        return x
    if max(top, bottom) >= h or max(left, right) >= w:
        raise ValueError(
            f"input {h}x{w} is too small to reflect-pad to a multiple of {multiple}; "
            f"send tiles of at least {multiple // 2 + 1} pixels a side"
        )
    x = F.pad(x.reshape(b, c * t, h, w), (left, right, top, bottom), mode="reflect")
    return x.reshape(b, c, t, *x.shape[-2:])


def resize_and_crop(logits: torch.Tensor, padded: Sequence[int], size: Sequence[int]) -> torch.Tensor:
    """Logits -> bilinearly resized to the padded input (align_corners=False, as both references do), then
    the centre `size` that `reflect_pad` padded around."""
    if tuple(logits.shape[-2:]) != tuple(padded):
        logits = F.interpolate(logits, size=padded, mode="bilinear", align_corners=False)
    (hp, wp), (h, w) = padded, size
    top, left = (hp - h) // 2, (wp - w) // 2
    return logits[..., top : top + h, left : left + w]


class TileSegmentation(nn.Module, ABC):
    """A segmentation model's forward around its network: the frames axis, the date-major reshape when the
    checkpoint was trained with it, reflect padding to `pad_multiple`, then the logits resized and cropped
    back. A layout gives `pad_multiple` and `logits(x, temporal_coords, location_coords)` of a padded x."""

    def __init__(self, date_major: bool = False):
        super().__init__()
        self.date_major = date_major

    @property
    @abstractmethod
    def pad_multiple(self) -> int:
        """Inputs are reflect-padded to a multiple of this many pixels."""

    @abstractmethod
    def logits(self, x: torch.Tensor, temporal_coords: Optional[torch.Tensor],
               location_coords: Optional[torch.Tensor]) -> torch.Tensor:
        """Padded [B, C, T, H, W] -> logits [B, num_classes, h, w] (any h, w: the forward resizes them)."""

    def forward(
        self,
        x: torch.Tensor,
        temporal_coords: Optional[torch.Tensor] = None,
        location_coords: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """x: normalised [B, C, H, W] or [B, C, T, H, W] -> logits [B, num_classes, H, W].

        temporal_coords: [B, T, 2] (year, day of year); location_coords: [B, 2] (lat, lon). Each is used
        only by models trained with that encoding and ignored otherwise.
        """
        x = as_frames(x)
        if self.date_major:
            x = date_major_reshape(x)
        size = x.shape[-2:]
        x = self._pad(x)
        return resize_and_crop(self.logits(x, temporal_coords, location_coords), x.shape[-2:], size)

    def _pad(self, x: torch.Tensor) -> torch.Tensor:
        return reflect_pad(x, self.pad_multiple)
