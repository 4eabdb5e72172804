"""Bodies for the GeoTIFF routes, which schemathesis cannot make from `{type: string, format: binary}`:
small real scenes the flood model accepts (6 int16 bands, a CRS, nodata) and their mutations (cut
short, 3 bands, no TIFF at all). Loaded by the fuzz run through `SCHEMATHESIS_HOOKS=tests.reliability.
fuzz_hooks` (test_fuzz.py)."""
from typing import List

import numpy as np
import rasterio
import schemathesis
from hypothesis import strategies as st
from rasterio.io import MemoryFile

from appliance.serving.http.route_table import GEOTIFF_TYPES

SIDE = 64  # pixels: one padded tile, a fraction of a second on the flood model


def geotiff(bands: int = 6, side: int = SIDE, seed: int = 0) -> bytes:
    """A scene as the flood model reads it: `bands` int16 bands in EPSG:32615, nodata -9999."""
    data = np.random.default_rng(seed).integers(0, 3000, size=(bands, side, side), dtype=np.int16)
    with MemoryFile() as memory:
        with memory.open(driver="GTiff", height=side, width=side, count=bands, dtype="int16", crs="EPSG:32615",
                         transform=rasterio.Affine(30, 0, 500000, 0, -30, 3300000), nodata=-9999) as dst:
            dst.write(data)
        return memory.read()


def scenes() -> List[bytes]:
    return [geotiff(seed=0), geotiff(side=96, seed=1)]


def mutations() -> List[bytes]:
    """Bodies that are no scene of the model: cut short, the wrong band count, not a TIFF."""
    whole = geotiff(seed=2)
    png = b"\x89PNG\r\n\x1a\n" + bytes(32)
    return [whole[: len(whole) // 2], geotiff(bands=3, seed=3), png, b"", b"II*\x00" + bytes(12)]


schemathesis.openapi.media_type(GEOTIFF_TYPES[0], st.sampled_from(scenes() + mutations()),
                                aliases=GEOTIFF_TYPES[1:])
