"""LLaVA-NeXT ("anyres"): LLaVA with a base view plus a grid of tiles per image, packed as one sequence.

Per image: pixel_values [1 + rows*cols, 3, S, S] (view 0 is the whole image resized to S x S, then the
tiles row-major), image_size (height, width) of the original image. Each view goes through the tower
and projector ([views, s*s, D], s = S // patch). Packing (what the placeholder run holds, in order):

    base:  the s*s features of view 0
    grid:  the tiles laid out as one (rows*s) x (cols*s) map, with the rows (or columns) that only
           saw the preprocessing's letterbox padding removed (`unpad`), and `image_newline` appended
           after every remaining row

so the count is `appliance.anyres_plan.llava_next_feature_count(image_size, config)`; the tile grid
comes from the same planner (`grid_shape`). image_features inputs hold the tower output per view:
[1 + rows*cols, s*s, vision hidden * k].
"""
from typing import Callable, Optional, Tuple

import torch
from torch import nn

from appliance.engine.models.llava import LlavaForConditionalGeneration as Llava
from appliance.engine.models.llava import check_num_tokens, feature_layers
from appliance.engine.multimodal import ImageItem
from appliance.engine.parallel import ParallelState
from appliance.anyres_plan import AnyresConfig, grid_shape, llava_next_feature_count


def unpad(grid: torch.Tensor, image_size: Tuple[int, int]) -> torch.Tensor:
    """Crop a [H, W, D] feature map to the part the original (height, width) image covers."""
    h, w = image_size
    gh, gw = grid.shape[:2]
    if w / h > gw / gh:  # wider than the grid: the padding is above and below
        content = int(round(h * (gw / w), 7))
        pad = (gh - content) // 2
        return grid[pad:gh - pad]
    content = int(round(w * (gh / h), 7))
    pad = (gw - content) // 2
    return grid[:, pad:gw - pad]


class LlavaNextForConditionalGeneration(Llava):
    def __init__(self, hf_config, tp: ParallelState, backend, max_positions: Optional[int] = None):
        super().__init__(hf_config, tp, backend, max_positions)
        if self.select_strategy != "default":
            raise ValueError("config.json: LLaVA-NeXT supports vision_feature_select_strategy 'default' only "
                             "(tile features with CLS do not form a grid; transformers fails on it too)")
        self.anyres = AnyresConfig.from_model_config(hf_config.to_dict())
        self.image_newline = nn.Parameter(torch.zeros(hf_config.text_config.hidden_size))

    @classmethod
    def image_item_check(cls, hf_config) -> Callable[[ImageItem], None]:
        """The item must have image_size, 1 + rows*cols views of the model's shape and
        llava_next_feature_count(image_size) placeholders."""
        anyres = AnyresConfig.from_model_config(hf_config.to_dict())
        v = hf_config.vision_config
        view_pixels = (3, v.image_size, v.image_size)
        view_features = (cls.view_tokens(hf_config), v.hidden_size * len(feature_layers(hf_config)))

        def check(item: ImageItem) -> None:
            if item.image_size is None or len(item.image_size) != 2 or min(item.image_size) < 1:
                raise ValueError(f"image {item.content_hash}: LLaVA-NeXT needs image_size (height, width), "
                                 f"got {item.image_size}")
            if (item.pixel_values is None) == (item.features is None):
                raise ValueError(f"image {item.content_hash}: give exactly one of pixel_values and features")
            height, width = item.image_size
            rows, cols = grid_shape((height, width), anyres)
            want: Tuple[int, ...]
            if item.pixel_values is not None:
                what, want, got = "pixel_values", (1 + rows * cols, *view_pixels), tuple(item.pixel_values.shape)
            elif item.features is not None:
                what, want, got = "features", (1 + rows * cols, *view_features), tuple(item.features.shape)
            if got != want:
                raise ValueError(f"image {item.content_hash}: an image of size {(height, width)} takes "
                                 f"{what} of shape {want} (base view + {rows}x{cols} tiles), got {got}")
            check_num_tokens(item, llava_next_feature_count((height, width), anyres))

        return check

    def pack(self, feats: torch.Tensor, image_size: Tuple[int, int]) -> torch.Tensor:
        """Projected per-view features [views, s*s, D] -> the image's embedding sequence [tokens, D]."""
        base, tiles = feats[0], feats[1:]
        newline = self.image_newline.to(feats.dtype)
        if tiles.shape[0] == 0:  # a single view: base + one newline (as transformers does)
            return torch.cat([base, newline[None]])
        rows, cols = grid_shape(image_size, self.anyres)
        if tiles.shape[0] != rows * cols:
            raise ValueError(f"an image of size {tuple(image_size)} is cut into {rows}x{cols} tiles, but "
                             f"{tiles.shape[0]} tile views were given")
        s = self.anyres.tile_size // self.anyres.patch_size
        d = feats.shape[-1]
        grid = tiles.view(rows, cols, s, s, d).permute(0, 2, 1, 3, 4).reshape(rows * s, cols * s, d)
        grid = unpad(grid, image_size)
        grid = torch.cat([grid, newline.expand(grid.shape[0], 1, d)], dim=1)
        return torch.cat([base, grid.reshape(-1, d)])

    def views(self, item: ImageItem) -> torch.Tensor:
        pixels = item.pixel_values
        if pixels is None:
            raise ValueError(f"image {item.content_hash}: no pixel_values to make its views from")
        if pixels.dim() != 4:
            raise ValueError(f"image {item.content_hash}: LLaVA-NeXT pixel_values must be "
                             f"[1 + tiles, 3, H, W], got {tuple(pixels.shape)}")
        return pixels

    def finish(self, item: ImageItem, feats: torch.Tensor) -> torch.Tensor:
        """Per-view tower features [views, tokens, D] -> projected and packed embeddings."""
        if item.image_size is None:
            raise ValueError(f"image {item.content_hash}: LLaVA-NeXT needs image_size (height, width)")
        if feats.dim() != 3:
            raise ValueError(f"image {item.content_hash}: LLaVA-NeXT features must be [views, tokens, dim], "
                             f"got {tuple(feats.shape)}")
        return self.pack(self.project(feats), item.image_size)
