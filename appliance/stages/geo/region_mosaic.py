"""`mosaic.tif`: every item's mask over the region, in one CRS, as one class COG.

The grid: the CRS most items share (the oldest item's on a tie), the finest pixel size among those items,
aligned on the oldest such item's grid, covering every item's bounds; masks in another CRS are warped in
by nearest neighbour. Where masks overlap, the rule decides (`MosaicRule`): `latest`, the most recent
item's class; `max_class`, the highest class index any item gives (for flood or burn maps, water or burnt
wins). Nodata (255) never covers a class. Written strip by strip of rows (never the whole mosaic in
memory), then copied to a COG (cog.py) and renamed into place.
"""
import math
import os
from collections import Counter
from enum import Enum
from typing import List, Optional, Sequence

import numpy as np
import rasterio
from affine import Affine
from rasterio.crs import CRS
from rasterio.vrt import WarpedVRT
from rasterio.warp import Resampling, transform_bounds
from rasterio.windows import Window, from_bounds

from appliance.output_files import AtomicFile
from appliance.stages.geo.cog import translate_to_cog
from appliance.stages.geo.region_items import RegionItem
from appliance.stages.geo.stitch import NODATA_CLASS

MOSAIC_FILE = "mosaic.tif"
STRIP_ROWS = 512  # mosaic rows composed at a time
BLOCK = 512


class MosaicRule(str, Enum):
    latest = "latest"  # the most recent item's class where items overlap
    max_class = "max_class"  # the highest class index where items overlap


def combine(mosaic: np.ndarray, mask: np.ndarray, rule: MosaicRule) -> np.ndarray:
    """`mask` laid over `mosaic` (items come oldest first) by `rule`; nodata never covers a class."""
    valid = mask != NODATA_CLASS
    if rule is MosaicRule.max_class:
        valid &= (mosaic == NODATA_CLASS) | (mask > mosaic)
    return np.where(valid, mask, mosaic)


def placed(items: Sequence[RegionItem]) -> List[RegionItem]:
    """The items whose mask has a CRS: a mask in pixel coordinates only has no place on the mosaic."""
    found = []
    for r in items:
        with rasterio.open(r.mask_path) as ds:
            if ds.crs is not None:
                found.append(r)
    return found


def mosaic_grid(items: Sequence[RegionItem]):
    """(crs, transform, width, height) of the mosaic, by the rule in the module docstring."""
    grids = []
    for r in items:
        with rasterio.open(r.mask_path) as ds:
            grids.append((ds.crs, ds.transform, ds.bounds))
    crs = Counter(g[0].to_wkt() for g in grids).most_common(1)[0][0]
    same = [g for g in grids if g[0].to_wkt() == crs]
    size = min(abs(g[1].a) for g in same)
    origin = same[0][1]
    boxes = [transform_bounds(g[0], crs, *g[2], densify_pts=21) if g[0].to_wkt() != crs else g[2] for g in grids]
    left = origin.c + math.floor((min(b[0] for b in boxes) - origin.c) / size) * size
    top = origin.f - math.floor((origin.f - max(b[3] for b in boxes)) / size) * size
    width = math.ceil((max(b[2] for b in boxes) - left) / size - 1e-6)
    height = math.ceil((top - min(b[1] for b in boxes)) / size - 1e-6)
    return CRS.from_wkt(crs), Affine(size, 0.0, left, 0.0, -size, top), width, height


def write_mosaic(directory: str, items: Sequence[RegionItem], rule: MosaicRule) -> str:
    """Write `mosaic.tif` in `directory` from `items` (oldest first); returns its path."""
    crs, transform, width, height = mosaic_grid(items)
    path = os.path.join(directory, MOSAIC_FILE)
    with rasterio.open(items[0].mask_path) as first:
        colormap, tags = first.colormap(1), first.tags()
    draft, target = AtomicFile(path, sidecars=(".aux.xml",)), AtomicFile(path, sidecars=(".aux.xml",))
    try:
        profile = dict(driver="GTiff", width=width, height=height, count=1, dtype="uint8", crs=crs,
                       transform=transform, nodata=NODATA_CLASS, tiled=True, blockxsize=BLOCK, blockysize=BLOCK,
                       compress="deflate")
        with rasterio.open(draft.temp_path, "w", **profile) as out:
            out.write_colormap(1, colormap)
            out.update_tags(class_names=tags.get("class_names", ""), class_colours=tags.get("class_colours", ""),
                            mosaic_rule=rule.value)
            sources = [rasterio.open(r.mask_path) for r in items]
            try:
                warped = [WarpedVRT(s, crs=crs, transform=transform, width=width, height=height,
                                    nodata=NODATA_CLASS, resampling=Resampling.nearest) for s in sources]
                footprints = [_footprint(s, crs, transform, width, height) for s in sources]
                for row in range(0, height, STRIP_ROWS):
                    window = Window(0, row, width, min(STRIP_ROWS, height - row))
                    strip = np.full((window.height, width), NODATA_CLASS, dtype=np.uint8)
                    for vrt, footprint in zip(warped, footprints):
                        part = _overlap(window, footprint)
                        if part is not None:  # read only where the mask lies
                            rows, cols = slice(part.row_off - row, part.row_off - row + part.height), \
                                slice(part.col_off, part.col_off + part.width)
                            strip[rows, cols] = combine(strip[rows, cols], vrt.read(1, window=part), rule)
                    out.write(strip, 1, window=window)
                for vrt in warped:
                    vrt.close()
            finally:
                for s in sources:
                    s.close()
        translate_to_cog(draft.temp_path, target.temp_path, BLOCK, "MODE")
        target.commit()
    except BaseException:
        target.abort()
        raise
    finally:
        draft.abort()
    return path


def _footprint(source, crs, transform, width: int, height: int) -> Window:
    """The mosaic pixels `source`'s bounds cover (one pixel wider each side for a warped one), clipped."""
    bounds = source.bounds if source.crs == crs else transform_bounds(source.crs, crs, *source.bounds, densify_pts=21)
    exact = from_bounds(*bounds, transform=transform)
    margin = 0 if source.crs == crs else 1
    left, top = math.floor(exact.col_off) - margin, math.floor(exact.row_off) - margin
    right = math.ceil(exact.col_off + exact.width - 1e-6) + margin
    bottom = math.ceil(exact.row_off + exact.height - 1e-6) + margin
    return _overlap(Window(0, 0, width, height), Window(left, top, right - left, bottom - top))


def _overlap(a: Window, b: Optional[Window]) -> Optional[Window]:
    if b is None:
        return None
    left, top = max(a.col_off, b.col_off), max(a.row_off, b.row_off)
    right, bottom = min(a.col_off + a.width, b.col_off + b.width), min(a.row_off + a.height, b.row_off + b.height)
    return Window(left, top, right - left, bottom - top) if right > left and bottom > top else None
