"""`tile`: one record per tile window of each scene, reading only that window.

Each tile record carries `pixels` (float32 reflectance [C, S, S] for tile size S, padded when the scene
is smaller than a tile; [C, T, S, S] for a scene of T dates, every date's window of the same place), `valid` (bool
[h, w], the tile's extent inside the scene) and `tile` (a `TileRef`:
scene key, plan, window), and for a model with time and location encodings `coords` (the scene's
GeoCoords, shared by its tiles). Records keep the scene's fields, so later stages see `scene`, `output_path`.
"""
from dataclasses import dataclass, replace
from enum import Enum
from typing import Dict, Iterator, Optional

import numpy as np
import rasterio

from appliance.engine.geo_coords import COORDS_FIELD
from appliance.errors import ConfigError
from appliance.pipeline import Record, ResolvedOptions, Stage, register_stage
from appliance.stages.geo.plan import TilePlan, TileWindow, plan_tiles
from appliance.stages.geo.raster_read import geo_contract
from appliance.stages.geo.window_reader import SceneReader, open_scene


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
    # numpy types `mode` as a Literal of its modes; `mode` is a Padding value, each one of them.
    return np.pad(pixels, ((0, 0), (0, tile_size - h), (0, tile_size - w)), mode=mode)  # type: ignore[call-overload]


def block_cache_bytes(reader: SceneReader, tile_size: int) -> int:
    """GDAL keeps decoded blocks up to GDAL_CACHEMAX (default 5% of RAM), so its cache grows with the
    scene's area; one band of tile rows (of the blocks the scene's window touches) is enough for
    overlapping windows to hit it."""
    block = reader.block_height
    width = reader.scene.width + 2 * block  # an area of interest need not start on a block edge
    row_band = (tile_size + 2 * block) * width * len(reader.scene.files) * reader.itemsize
    return max(16 << 20, row_band)


def frames_first(pixels: np.ndarray, frames: int) -> np.ndarray:
    """[T x C, S, S] (date after date) -> [C, T, S, S], the model's layout; one date stays [C, S, S]."""
    if frames == 1:
        return pixels
    bands = pixels.shape[0] // frames
    return np.ascontiguousarray(pixels.reshape(frames, bands, *pixels.shape[1:]).transpose(1, 0, 2, 3))


class Padding(str, Enum):
    """How a scene smaller than one tile is padded up to the tile size (numpy `np.pad` modes)."""

    reflect = "reflect"  # mirror without repeating the edge pixel (what the Prithvi models saw)
    edge = "edge"
    constant = "constant"  # zeros (in reflectance, before normalisation)


@dataclass
class TileOptions:
    """Give `stride` or `overlap` (= tile_size - stride), not both unless they agree; neither means
    overlap = tile_size // 8."""

    tile_size: Optional[int] = None  # None: model.geo.tile_size (what the fine-tune was trained on)
    stride: Optional[int] = None
    overlap: Optional[int] = None
    padding: Padding = Padding.reflect  # scenes smaller than a tile


def effective_stride(tiling: TileOptions, size: int, where: str = "tile") -> int:
    """The stride in pixels for tiles of `size`; ConfigError (naming `where`) when the options are inconsistent."""
    if size < 1:
        raise ConfigError(f"{where}.tile_size: must be >= 1 (got {size})")
    if tiling.stride is not None and tiling.overlap is not None and tiling.stride != size - tiling.overlap:
        raise ConfigError(
            f"{where}: stride={tiling.stride} and overlap={tiling.overlap} disagree for tile_size={size} "
            f"(stride = tile_size - overlap); give only one of them"
        )
    if tiling.stride is not None:
        stride = tiling.stride
        if not 1 <= stride <= size:
            raise ConfigError(f"{where}.stride: must be in 1..tile_size={size} so tiles leave no gap (got {stride})")
        return stride
    overlap = size // 8 if tiling.overlap is None else tiling.overlap
    if not 0 <= overlap < size:
        raise ConfigError(f"{where}.overlap: must be in 0..tile_size-1={size - 1} (got {overlap})")
    return size - overlap


@register_stage
class Tile(Stage):
    name = "tile"
    consumes = ("scene",)
    produces = ("pixels", "valid", "tile")
    Options = TileOptions

    def __init__(self, options: TileOptions, cfg):
        super().__init__(options, cfg)
        self.tile_size, self.stride = self.options.tile_size, self.options.stride

    @classmethod
    def resolve_options(cls, options: TileOptions, cfg) -> ResolvedOptions:
        """tile_size from model.geo.tile_size when unset; stride and overlap both spelled out."""
        from_model: Dict[str, str] = {}
        size = options.tile_size
        if size is None:
            size, from_model["tile_size"] = geo_contract(cfg, cls.name).tile_size, "model.geo.tile_size"
        stride = effective_stride(options, size, cls.name)
        derived: Dict[str, str] = {}
        if options.overlap is None:
            derived["overlap"] = "tile_size // 8" if options.stride is None else "tile_size - stride"
        if options.stride is None:
            derived["stride"] = "tile_size - overlap"
        resolved = replace(options, tile_size=size, stride=stride, overlap=size - stride)
        return ResolvedOptions(resolved, from_model, derived)

    def process(self, records: Iterator[Record]) -> Iterator[Record]:
        size, mode = self.tile_size, self.options.padding.value
        for record in records:
            scene = record["scene"]
            plan = plan_tiles(scene.height, scene.width, size, self.stride)
            with open_scene(scene) as reader, rasterio.Env(GDAL_CACHEMAX=block_cache_bytes(reader, size)):
                for window in plan.tiles():
                    pixels, valid = reader.read(window.y, window.x, window.height, window.width)
                    out = {
                        **record,
                        "pixels": frames_first(pad_to_tile(pixels, size, mode), scene.frames),
                        "valid": valid,
                        "tile": TileRef(scene.key, plan, window),
                    }
                    if scene.coords is not None:
                        out[COORDS_FIELD] = scene.coords
                    yield out
