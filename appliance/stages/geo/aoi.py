"""Area of interest: a bounding box that limits a run to one window of the scene.

`parse_aoi` checks the run's `aoi` ([xmin, ymin, xmax, ymax]) and `aoi_crs` (default EPSG:4326,
lon/lat); `aoi_window` turns it into the scene's pixel window: the box is carried into the scene's
CRS (edges densified, so a lon/lat box becomes the UTM box that contains it), then widened to whole
pixels and clipped to the scene. The run then reads, tiles and writes that window only: the mask is
the window, georeferenced by the window's transform.
"""
import math
from dataclasses import dataclass, field as dataclass_field
from typing import Any, Optional, Tuple

from rasterio.crs import CRS
from rasterio.errors import CRSError
from rasterio.transform import array_bounds
from rasterio.warp import transform_bounds

from appliance.errors import InputError

EPS = 1e-6  # of a pixel


@dataclass(frozen=True)
class Aoi:
    bounds: Tuple[float, float, float, float]  # xmin, ymin, xmax, ymax in `crs`
    crs: str = "EPSG:4326"
    name: str = dataclass_field(default="aoi", compare=False)  # how messages name it (`data.aoi` in a request)


def parse_aoi(value: Any, crs: Optional[str] = None, where: str = "") -> Optional[Aoi]:
    """`where` prefixes the fields' names in messages and `param` (a server request: `data.`)."""
    field, crs_field = f"{where}aoi", f"{where}aoi_crs"
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):
        value = [part for part in value.replace(",", " ").split() if part]
    try:
        bounds = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        bounds = ()
    if len(bounds) != 4 or not all(math.isfinite(b) for b in bounds):
        raise InputError(f"{field}: expected [xmin, ymin, xmax, ymax] (lon/lat unless {crs_field} is given), "
                         f"got {value!r}", param=field)
    if not (bounds[0] < bounds[2] and bounds[1] < bounds[3]):
        raise InputError(f"{field}: {list(bounds)} is empty; give [xmin, ymin, xmax, ymax] with xmin < xmax, "
                         "ymin < ymax", param=field)
    name = str(crs) if crs else "EPSG:4326"
    try:
        CRS.from_user_input(name)
    except (CRSError, ValueError):  # ValueError: rasterio's parse of "EPSG:nope"
        raise InputError(f"{crs_field}: {name!r} is not a coordinate reference system; give one like EPSG:32615",
                         param=crs_field) from None
    return Aoi(bounds, name, field)


def aoi_window(aoi: Aoi, scene_crs, transform, width: int, height: int, name: str) -> Tuple[int, int, int, int]:
    """(row, column, height, width) of the scene's pixels the box touches. InputError when the scene has no
    CRS or the box misses it."""
    if scene_crs is None:
        raise InputError(f"{aoi.name}: {name} has no CRS, so an aoi cannot be placed on it; run it whole",
                         param=aoi.name)
    box = transform_bounds(CRS.from_user_input(aoi.crs), scene_crs, *aoi.bounds, densify_pts=21)
    inverse = ~transform
    corners = [inverse @ (x, y) for x in (box[0], box[2]) for y in (box[1], box[3])]
    cols, rows = [c for c, _ in corners], [r for _, r in corners]
    # Whole pixels, ignoring float noise: a box on pixel edges must not grow by a pixel.
    col0, col1 = max(0, math.floor(min(cols) + EPS)), min(width, math.ceil(max(cols) - EPS))
    row0, row1 = max(0, math.floor(min(rows) + EPS)), min(height, math.ceil(max(rows) - EPS))
    if col0 >= col1 or row0 >= row1:
        west, south, east, north = transform_bounds(scene_crs, CRS.from_user_input(aoi.crs),
                                                    *array_bounds(height, width, transform))
        raise InputError(f"{aoi.name}: {list(aoi.bounds)} ({aoi.crs}) does not overlap {name}, which covers "
                         f"[{west:.6g}, {south:.6g}, {east:.6g}, {north:.6g}] in {aoi.crs}", param=aoi.name)
    return row0, col0, row1 - row0, col1 - col0
