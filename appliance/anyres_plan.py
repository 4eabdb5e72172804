"""LLaVA-NeXT "anyres" planning: which tile grid an image of (height, width) gets and how many image
tokens the model makes for it. Pure integer arithmetic on sizes, shared by the request side
(`appliance/vision/anyres.py` cuts the pixels by this plan) and the engine (`engine/models/llava_next.py`
packs the features by it and checks placeholder counts); it imports neither.

The plan for an image of size (h, w), pinpoints P = [(H, W), ...] in (height, width) order, tile side T
(the crop size, 336) and vision patch p (14), with s = T // p patches per tile side (24):

1. pinpoint: for each (H, W), scale = min(W / w, H / h); effective = min(int(w*scale) * int(h*scale), w*h);
   wasted = H*W - effective. Take the largest effective; ties go to the smaller wasted, then to the
   earlier pinpoint.
2. resize the image into (H, W) keeping its aspect: the side that limits is set exactly, the other is
   `min(ceil(side * scale), limit)`; pad with black, centred (the odd pixel goes right/bottom).
3. cut the padded image into (H // T) x (W // T) tiles of T x T, row-major; each tile and the base view
   (the whole image resized to T x T, aspect ignored) go through the CLIP steps.
4. the model packs features as: s*s base tokens (CLS dropped for the "default" strategy), then the tile
   grid as one (rows*s) x (cols*s) map with the padding rows (or columns) removed, plus one newline
   token per remaining row. Removing padding: if w / h > cols / rows, the content height is
   `int(round(h * cols*s / w, 7))` and (rows*s - that) // 2 rows go from each end; otherwise the same on
   the width. That total is `llava_next_feature_count`, which sizes the `<image>` placeholder.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from appliance.errors import ConfigError

LLAVA_NEXT_PINPOINTS = ((336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008))


@dataclass(frozen=True)
class AnyresConfig:
    """What decides the token count: from the model's config.json (`LlavaNextConfig`)."""
    grid_pinpoints: tuple[tuple[int, int], ...] = LLAVA_NEXT_PINPOINTS  # (height, width)
    tile_size: int = 336        # vision_config.image_size
    patch_size: int = 14        # vision_config.patch_size
    feature_select_strategy: str = "default"  # "default" drops CLS from the base view; "full" keeps it

    def __post_init__(self):
        if self.feature_select_strategy not in ("default", "full"):
            raise ConfigError(f"config.json: vision_feature_select_strategy = {self.feature_select_strategy!r}; "
                              "allowed: default, full")
        if not self.grid_pinpoints or any(h < self.tile_size or w < self.tile_size
                                          for h, w in self.grid_pinpoints):
            raise ConfigError(f"config.json: image_grid_pinpoints {list(self.grid_pinpoints)!r} must be "
                              f"[height, width] pairs of at least image_size {self.tile_size}")

    @classmethod
    def from_model_config(cls, config: Mapping[str, Any]) -> "AnyresConfig":
        vision = config.get("vision_config") or {}
        pins = config.get("image_grid_pinpoints") or LLAVA_NEXT_PINPOINTS
        return cls(grid_pinpoints=tuple((int(h), int(w)) for h, w in pins),
                   tile_size=int(vision.get("image_size", 336)),
                   patch_size=int(vision.get("patch_size", 14)),
                   feature_select_strategy=str(config.get("vision_feature_select_strategy", "default")))


def select_pinpoint(image_hw: tuple[int, int], pinpoints: Sequence[Sequence[int]]) -> tuple[int, int]:
    """The (height, width) pinpoint that keeps the most image pixels, then wastes the fewest."""
    h, w = image_hw
    best, best_key = None, None
    for ph, pw in pinpoints:
        scale = min(pw / w, ph / h)
        effective = min(int(w * scale) * int(h * scale), w * h)
        key = (effective, -(ph * pw - effective))
        if best_key is None or key > best_key:
            best, best_key = (int(ph), int(pw)), key
    if best is None:
        raise ValueError("grid_pinpoints is empty: the model config names no grid to tile an image into")
    return best


def fit_within(image_hw: tuple[int, int], target_hw: tuple[int, int]) -> tuple[int, int]:
    """Size of the image scaled to fit `target_hw` with its aspect kept (the limiting side exact)."""
    h, w = image_hw
    th, tw = target_hw
    scale_w, scale_h = tw / w, th / h  # scale first, then multiply: the float rounding is the reference's
    if scale_w < scale_h:
        return min(math.ceil(h * scale_w), th), tw
    return th, min(math.ceil(w * scale_h), tw)


def grid_shape(image_hw: tuple[int, int], config: AnyresConfig) -> tuple[int, int]:
    """(rows, cols) of tiles the model will see for an image of (height, width)."""
    ph, pw = select_pinpoint(image_hw, config.grid_pinpoints)
    return ph // config.tile_size, pw // config.tile_size


def llava_next_feature_count(image_size: tuple[int, int], config: AnyresConfig) -> int:
    """Image tokens LLaVA-NeXT produces for an image of (height, width): base + unpadded grid + newlines."""
    h, w = image_size
    if h <= 0 or w <= 0:
        raise ValueError(f"image_size must be positive (height, width), got {image_size}")
    side = config.tile_size // config.patch_size
    rows, cols = grid_shape(image_size, config)
    grid_h, grid_w = rows * side, cols * side
    if w / h > grid_w / grid_h:   # wider than the grid: padding rows top and bottom
        content = int(round(h * (grid_w / w), 7))
        grid_h -= (grid_h - content) // 2 * 2
    else:                         # taller (or equal): padding columns left and right
        content = int(round(w * (grid_h / h), 7))
        grid_w -= (grid_w - content) // 2 * 2
    base = side * side + (1 if config.feature_select_strategy == "full" else 0)
    return base + grid_h * grid_w + grid_h
