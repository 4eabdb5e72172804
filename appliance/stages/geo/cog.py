"""Cloud-Optimized GeoTIFF: convert a finished tiled GeoTIFF with GDAL's COG driver, and say whether a file
is one.

The mask is first written strip by strip as a plain tiled GeoTIFF (random-access writes the COG driver
cannot take), then copied once by the COG driver, which adds internal overviews and lays the file out
for HTTP range reads: header and tile index first, overviews before full resolution. Both passes work
block by block through GDAL's cache, so memory does not grow with the scene.
"""
from typing import List, Optional

import rasterio
from rasterio.shutil import copy as gdal_copy

# The ghost header GDAL's COG driver writes at the top of the file (GDAL's COG specification).
COG_GHOST_MARKER = b"LAYOUT=IFDS_BEFORE_DATA"


def overview_resampling(classes: bool, chosen: Optional[str]) -> str:
    """`mode` keeps class maps to their classes at every zoom (nodata excluded); `average` smooths
    probabilities. `chosen` (a GDAL resampling name) wins."""
    if chosen:
        return chosen.upper()
    return "MODE" if classes else "AVERAGE"


def translate_to_cog(source: str, target: str, block_size: int, resampling: str) -> None:
    """Copy the GeoTIFF `source` to a COG at `target` (deflate, `block_size` tiles, overviews down to one
    block). Colour table, band descriptions, nodata and tags come along. Raises RasterioError."""
    with rasterio.Env():
        gdal_copy(source, target, driver="COG", COMPRESS="DEFLATE", BLOCKSIZE=block_size,
                  OVERVIEW_RESAMPLING=resampling, BIGTIFF="IF_SAFER", STATISTICS="NO")


def cog_problems(path: str) -> List[str]:
    """Why `path` is not a valid COG ([] when it is): GDAL's layout tag, the ghost header before the
    first IFD, tiling, and an internal overview per level down to one block."""
    problems = []
    with open(path, "rb") as f:
        if COG_GHOST_MARKER not in f.read(512):
            problems.append("no COG ghost header (IFDs are not before the data)")
    with rasterio.open(path) as ds:
        if ds.tags(ns="IMAGE_STRUCTURE").get("LAYOUT") != "COG":
            problems.append("GDAL does not report LAYOUT=COG")
        block_h, block_w = ds.block_shapes[0]
        if block_w >= ds.width and block_h >= ds.height:
            return problems  # one block: no tiling or overviews needed
        if not ds.profile.get("tiled"):
            problems.append("not tiled")
        factors = ds.overviews(1)
        if not factors:
            problems.append("no internal overviews")
        elif max(-(-ds.width // factors[-1]), -(-ds.height // factors[-1])) > max(block_w, block_h):
            problems.append(f"the smallest overview (1/{factors[-1]}) is larger than one block")
    return problems
