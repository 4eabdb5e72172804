"""`tile`: one record per tile window of each scene, reading only that window.

Each tile record carries `pixels` (float32 reflectance [C, T, T], padded when the scene is smaller
than a tile), `valid` (bool [h, w], the tile's extent inside the scene) and `tile` (a `TileRef`:
scene key, plan, window). Records keep the scene's fields, so later stages see `scene`, `output_path`.
"""
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import rasterio

from appliance.pipeline import Record, Stage, register_stage
from appliance.stages.geo.config import TilingConfig, effective_stride
from appliance.stages.geo.plan import TilePlan, TileWindow, plan_tiles
from appliance.stages.geo.scene import open_raster, read_window


@dataclass(frozen=True)
class TileRef:
    scene_key: str  # SceneInfo.key
    plan: TilePlan
    window: TileWindow

    @property
    def index(self) -> int:
        return self.window.index

    @property
    def count(self) -> int:
        return self.plan.count


def pad_to_tile(pixels: np.ndarray, tile_size: int, mode: str) -> np.ndarray:
    """Pad [C, h, w] at the bottom/right up to [C, T, T]; a no-op for full tiles."""
    _, h, w = pixels.shape
    if h == tile_size and w == tile_size:
        return pixels
    return np.pad(pixels, ((0, 0), (0, tile_size - h), (0, tile_size - w)), mode=mode)


def block_cache_bytes(ds, tile_size: int) -> int:
    """GDAL keeps decoded blocks up to GDAL_CACHEMAX (default 5% of RAM), so its cache grows with the
    scene's area; one band of tile rows is enough for overlapping windows to hit it."""
    block_height = ds.block_shapes[0][0]
    row_band = (tile_size + 2 * block_height) * ds.width * ds.count * np.dtype(ds.dtypes[0]).itemsize
    return max(16 << 20, row_band)


@register_stage
class Tile(Stage):
    name = "tile"
    Options = TilingConfig
    consumes = ("scene",)
    produces = ("pixels", "valid", "tile")

    def __init__(self, options, cfg):
        super().__init__(options, cfg)
        self.stride = effective_stride(options, self.name)

    def process(self, records: Iterator[Record]) -> Iterator[Record]:
        size, mode = self.options.tile_size, self.options.padding.value
        for record in records:
            scene = record["scene"]
            plan = plan_tiles(scene.height, scene.width, size, self.stride)
            with open_raster(scene.path) as ds, rasterio.Env(GDAL_CACHEMAX=block_cache_bytes(ds, size)):
                for window in plan.tiles():
                    pixels, valid = read_window(ds, scene, window.y, window.x, window.height, window.width)
                    yield {
                        **record,
                        "pixels": pad_to_tile(pixels, size, mode),
                        "valid": valid,
                        "tile": TileRef(scene.key, plan, window),
                    }
