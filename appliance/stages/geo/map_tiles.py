"""A done scene as XYZ map tiles (Web Mercator, 256-px PNG) through rio-tiler: the mask in its class
colours, and the input as the RGB its preview shows (scene_report.py's `scene_rgb.json`: the files, bands
and stretch of scene.png). rio-tiler reads each tile's window only, from the overviews that fit its zoom
(the mask is a COG; an input's own overviews where it has them), so a tile costs the same memory whatever
the scene's size.

Transparent in a tile: class 0 (as in mask.png: what lies below shows), the input's no data, and everything
beyond the scene; a tile wholly beyond it is one transparent tile. The mask's no data is grey, as in
mask.png and the legend.
"""
import io
import json
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence, Tuple

import morecantile
import numpy as np
from PIL import Image
from rasterio.warp import calculate_default_transform
from rio_tiler.errors import TileOutsideBounds
from rio_tiler.io import Reader

from appliance.stages.geo.quicklook import mask_classes, stretched
from appliance.stages.geo.scene_report import palette_mask, tagged_class_names, tagged_colours
from appliance.stages.geo.stitch import NODATA_CLASS

TILE_SIZE = 256
WEB_MERCATOR = morecantile.tms.get("WebMercatorQuad")
MAX_ZOOM = WEB_MERCATOR.maxzoom  # the grid's zooms: 0..MAX_ZOOM
MAX_TILE_INDEX = 2 ** MAX_ZOOM - 1  # the largest x or y of any zoom (zoom z's are 0..2**z - 1)


@dataclass(frozen=True)
class TileGrid:
    """Where a scene's tiles are: lon/lat bounds [west, south, east, north] and the zooms worth asking."""
    bounds: Tuple[float, float, float, float]
    minzoom: int
    maxzoom: int  # the first zoom whose tile pixel is no larger than a scene pixel


def tile_grid(mask_path: str) -> TileGrid:
    with Reader(mask_path, tms=WEB_MERCATOR) as reader:
        ds = reader.dataset
        transform, _, _ = calculate_default_transform(ds.crs, WEB_MERCATOR.rasterio_crs, ds.width, ds.height,
                                                      *ds.bounds)
        maxzoom = WEB_MERCATOR.zoom_for_res(abs(transform.a), zoom_level_strategy="upper")
        west, south, east, north = reader.get_geographic_bounds(morecantile.models.WGS84_CRS)
        return TileGrid((west, south, east, north), min(reader.minzoom, maxzoom), maxzoom)


def empty_tile() -> bytes:
    return _png(Image.new("RGBA", (TILE_SIZE, TILE_SIZE)))


def mask_tile(mask_path: str, z: int, x: int, y: int) -> bytes:
    """The classes of tile z/x/y in the mask's colours (nearest: each tile pixel one mask pixel's class)."""
    with Reader(mask_path, tms=WEB_MERCATOR) as reader:
        try:
            image = reader.tile(x, y, z, tilesize=TILE_SIZE, resampling_method="nearest",
                                nodata=beyond_fill(reader.dataset))
        except TileOutsideBounds:
            return empty_tile()
        colours = tagged_colours(reader.dataset, len(tagged_class_names(reader.dataset)))
    classes, nodata = mask_classes(np.asarray(image.array.data))
    beyond = outside(image.array)
    picture = palette_mask(np.where(beyond, 0, classes), nodata & ~beyond, colours)  # index: class; no data: last
    return _png(picture, transparency=bytes([0] + [255] * len(colours)))  # class 0 (and beyond) transparent


def beyond_fill(ds) -> float:
    """The value rio-tiler fills beyond the scene with and masks: one no mask pixel holds (below the no-data
    class for a class mask, whose classes are fewer; negative for probabilities), so the mask's own no data
    reads as data, drawn grey."""
    return NODATA_CLASS - 1 if ds.dtypes[0] == "uint8" else -1.0


def read_rendering(path: str) -> Dict[str, Any]:
    """scene_rgb.json: {"files": [3 paths], "bands": [3 bands, 1-based], "ranges": [3 (low, high) or null]}."""
    with open(path) as f:
        return json.load(f)


def rendering_files(rendering: Dict[str, Any]) -> List[str]:
    return list(dict.fromkeys(rendering["files"]))


def scene_tile(rendering: Dict[str, Any], z: int, x: int, y: int) -> bytes:
    """The input's red, green and blue of tile z/x/y, stretched as scene.png is; one read per file."""
    files: Sequence[str] = rendering["files"]
    data = np.zeros((3, TILE_SIZE, TILE_SIZE), dtype=np.float32)
    valid = np.ones((TILE_SIZE, TILE_SIZE), dtype=bool)
    for file in rendering_files(rendering):
        positions = [i for i, name in enumerate(files) if name == file]
        with Reader(file, tms=WEB_MERCATOR) as reader:
            try:
                image = reader.tile(x, y, z, tilesize=TILE_SIZE, resampling_method="nearest",
                                    indexes=[rendering["bands"][i] for i in positions])
            except TileOutsideBounds:
                return empty_tile()
        data[positions] = np.asarray(image.array.data, dtype=np.float32)
        valid &= ~outside(image.array)
    rgba = np.dstack([stretched(data, rendering["ranges"]).transpose(1, 2, 0), np.where(valid, 255, 0)])
    return _png(Image.fromarray(rgba.astype(np.uint8), "RGBA"))


def outside(array: np.ma.MaskedArray) -> np.ndarray:
    """[h, w] True where rio-tiler masked a band: no data, or beyond the scene."""
    return np.asarray(np.ma.getmaskarray(array).any(axis=0))


def _png(picture: Image.Image, **options) -> bytes:
    out = io.BytesIO()
    picture.save(out, format="PNG", **options)
    return out.getvalue()
