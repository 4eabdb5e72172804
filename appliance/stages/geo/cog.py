"""Cloud-Optimized GeoTIFF: convert a finished tiled GeoTIFF with GDAL's COG driver.

The mask is first written strip by strip as a plain tiled GeoTIFF (random-access writes the COG driver
cannot take), then copied once by the COG driver, which adds internal overviews and lays the file out
for HTTP range reads: header and tile index first, overviews before full resolution. Both passes work
block by block through GDAL's cache, so memory does not grow with the scene.
"""
from typing import Optional

import rasterio
from rasterio.shutil import copy as gdal_copy


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
