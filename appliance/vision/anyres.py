"""LLaVA-NeXT "anyres" on pixels: a base view plus a grid of full-resolution tiles, cut by the plan in
`appliance/anyres_plan.py` (pinpoint, resize, pad, tiles: its docstring has the formulas), each view
through the CLIP steps. The planning names are re-exported here for the request side.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from PIL import Image

from appliance.anyres_plan import (LLAVA_NEXT_PINPOINTS, AnyresConfig, fit_within, grid_shape,  # noqa: F401 - re-exported
                                   llava_next_feature_count, select_pinpoint)
from appliance.errors import ConfigError
from appliance.vision.clip_preprocess import ClipPreprocessConfig, clip_preprocess_batch, resize_image, to_rgb


@dataclass(frozen=True)
class AnyresOutput:
    pixel_values: torch.Tensor     # float32 [1 + rows*cols, 3, T, T]; index 0 is the base view
    image_size: tuple[int, int]    # original (height, width), what the model unpads with
    grid: tuple[int, int]          # (rows, cols) of tiles


def anyres_tiles(image: Image.Image, pinpoints: Sequence[Sequence[int]], tile_hw: tuple[int, int],
                 base_hw: tuple[int, int], resample: int = 3,
                 backend: str = "pil") -> tuple[list[Image.Image], tuple[int, int]]:
    """[base view, tile, tile, ...] as 8-bit images (row-major tiles), and (rows, cols)."""
    image = to_rgb(image)
    h, w = image.height, image.width
    th, tw = tile_hw
    if any(ph % th or pw % tw for ph, pw in pinpoints):
        raise ConfigError(f"preprocessor_config.json: image_grid_pinpoints {[list(p) for p in pinpoints]} "
                          f"must be multiples of the tile size {th}x{tw}")
    target_h, target_w = select_pinpoint((h, w), pinpoints)
    new_h, new_w = fit_within((h, w), (target_h, target_w))
    canvas = Image.new("RGB", (target_w, target_h), (0, 0, 0))
    canvas.paste(resize_image(image, (new_h, new_w), resample, backend),
                 ((target_w - new_w) // 2, (target_h - new_h) // 2))
    tiles = [canvas.crop((x, y, x + tw, y + th))
             for y in range(0, target_h, th) for x in range(0, target_w, tw)]
    base = resize_image(image, base_hw, resample, backend)
    return [base] + tiles, (target_h // th, target_w // tw)


def anyres_preprocess(image: Image.Image, cfg: ClipPreprocessConfig) -> AnyresOutput:
    """One image → base view + tiles, each through the CLIP steps: [1 + rows*cols, 3, T, T]."""
    if not cfg.image_grid_pinpoints:
        raise ConfigError("preprocessor_config.json: image_grid_pinpoints is missing; "
                          "LLaVA-NeXT needs a list of [height, width] pinpoints")
    base_hw = cfg.resize_hw or (cfg.short_side, cfg.short_side)
    tile = cfg.crop_hw[0] if cfg.do_center_crop else base_hw[0]
    views, grid = anyres_tiles(image, cfg.image_grid_pinpoints, (tile, tile), base_hw, cfg.resample,
                               cfg.resize_backend)
    return AnyresOutput(pixel_values=clip_preprocess_batch(views, cfg),
                        image_size=(image.height, image.width), grid=grid)
