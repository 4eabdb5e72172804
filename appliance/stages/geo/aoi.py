"""Area of interest: a bounding box that limits a run to one window of the scene.

`parse_aoi` checks the run's `aoi` ([xmin, ymin, xmax, ymax]) and `aoi_crs` (default EPSG:4326,
lon/lat): four finite numbers, a box with area, and, in a geographic CRS, lon in [-180, 180] and lat in
[-90, 90] (a box that reads as [lat, lon, ...] is told its [lon, lat, ...] form). `aoi_window` turns it
into the scene's pixel window: the box is carried into the scene's CRS (edges densified, so a lon/lat box
becomes the UTM box that contains it), then widened to whole pixels and clipped to the scene. A box that
misses the scene, or cannot be carried into its CRS at all (a projection answers inf far from its zone),
is told where the scene lies. The run then reads, tiles and writes that window only: the mask is the
window, georeferenced by the window's transform.

Projected CRSs are not range-checked here: rasterio does not expose a CRS's area of use; such a box is
caught when it cannot be carried into the scene's CRS or misses the scene.
"""
import math
from dataclasses import dataclass, field as dataclass_field
from typing import Any, Optional, Sequence, Tuple

from rasterio.crs import CRS
from rasterio.errors import CRSError
from rasterio.transform import array_bounds
from rasterio.warp import transform_bounds

from appliance.errors import InputError

EPS = 1e-6  # of a pixel
LON, LAT = 180.0, 90.0  # a geographic CRS's range, in degrees


@dataclass(frozen=True)
class Aoi:
    bounds: Tuple[float, float, float, float]  # xmin, ymin, xmax, ymax in `crs`
    crs: str = "EPSG:4326"
    name: str = dataclass_field(default="aoi", compare=False)  # how messages name it (`data.aoi` in a request)
    form: str = dataclass_field(default="{}", compare=False)  # a box as the client writes one: `aoi={}` (CLI)


def parse_aoi(value: Any, crs: Optional[str] = None, where: str = "") -> Optional[Aoi]:
    """`where` prefixes the fields' names in messages and `param` (a server request: `data.`). InputError
    naming the field for anything that is not a box in `crs`'s valid range."""
    field, crs_field = f"{where}aoi", f"{where}aoi_crs"
    form = "{}" if where else f"{field}={{}}"  # the CLI's `aoi=[...]`; a request's JSON list
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):
        value = [part for part in value.replace(",", " ").split() if part]
    try:
        bounds = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        bounds = ()
    if len(bounds) != 4 or not _finite(bounds):
        raise InputError(f"{field}: expected [xmin, ymin, xmax, ymax], four finite numbers (lon/lat unless "
                         f"{crs_field} is given), got {value!r}", param=field)
    name = str(crs) if crs else "EPSG:4326"
    try:
        parsed_crs = CRS.from_user_input(name)
    except (CRSError, ValueError):  # ValueError: rasterio's parse of "EPSG:nope"
        raise InputError(f"{crs_field}: {name!r} is not a coordinate reference system; give one like EPSG:32615",
                         param=crs_field) from None
    _check_extent(bounds, field, form)
    if _in_degrees(parsed_crs):
        _check_lon_lat(bounds, field, crs_field, form)
    return Aoi(bounds, name, field, form)


def _check_extent(bounds, field: str, form: str) -> None:
    xmin, ymin, xmax, ymax = bounds
    if xmin == xmax or ymin == ymax:
        raise InputError(f"{field}: {_box(bounds)} has no area (xmin = xmax or ymin = ymax); give [xmin, ymin, "
                         "xmax, ymax] with xmin < xmax and ymin < ymax", param=field)
    if xmin > xmax or ymin > ymax:
        ordered = (min(xmin, xmax), min(ymin, ymax), max(xmin, xmax), max(ymin, ymax))
        raise InputError(f"{field}: {_box(bounds)} has xmin > xmax or ymin > ymax; the order is [xmin, ymin, xmax, "
                         f"ymax]: did you mean {form.format(_box(ordered))}?", param=field)


def _check_lon_lat(bounds, field: str, crs_field: str, form: str) -> None:
    if _lon_lat_valid(bounds):
        return
    swapped = _swapped(bounds)
    advice = (f"did you mean {form.format(_box(swapped))} ([lon_min, lat_min, lon_max, lat_max])?"
              if _lon_lat_valid(swapped) else
              f"give [lon_min, lat_min, lon_max, lat_max], or name the box's CRS with {crs_field} "
              "(e.g. EPSG:32615 for UTM metres)")
    raise InputError(f"{field}: {_box(bounds)} is outside lon/lat's range (lon -180..180, lat -90..90); {advice}",
                     param=field)


def aoi_window(aoi: Aoi, scene_crs, transform, width: int, height: int, name: str) -> Tuple[int, int, int, int]:
    """(row, column, height, width) of the scene's pixels the box touches. InputError when the scene has no
    CRS, or the box misses it (or lies where the scene's CRS is not defined)."""
    if scene_crs is None:
        raise InputError(f"{aoi.name}: {name} has no CRS, so an aoi cannot be placed on it; run it whole",
                         param=aoi.name)
    box_crs = CRS.from_user_input(aoi.crs)
    covers = transform_bounds(scene_crs, box_crs, *array_bounds(height, width, transform), densify_pts=21)
    window = _pixel_window(aoi.bounds, box_crs, covers, scene_crs, transform, width, height)
    if window is not None:
        return window
    message = f"{aoi.name}: {_box(aoi.bounds)} ({aoi.crs}) does not overlap {name}"
    if _finite(covers):
        message += f", which covers [{', '.join(f'{v:.6g}' for v in covers)}] in {aoi.crs}"
    else:
        message += f" (its CRS, {scene_crs}, cannot be carried into {aoi.crs} there: give the box in {scene_crs})"
    swapped = _swapped(aoi.bounds)
    if (_in_degrees(box_crs) and _lon_lat_valid(swapped)
            and _pixel_window(swapped, box_crs, covers, scene_crs, transform, width, height) is not None):
        message += f"; did you mean {aoi.form.format(_box(swapped))} ([lon_min, lat_min, lon_max, lat_max])?"
    raise InputError(message, param=aoi.name)


def _pixel_window(bounds, box_crs, covers, scene_crs, transform, width: int, height: int):
    """(row, column, height, width), or None when the box misses the scene. The box is first cut to the
    scene's footprint in the box's CRS (`covers`): a projection is only trusted near its zone (UTM gives
    inf, or a wrong box, for the far side of the world)."""
    if _finite(covers):
        bounds = (max(bounds[0], covers[0]), max(bounds[1], covers[1]),
                  min(bounds[2], covers[2]), min(bounds[3], covers[3]))
        if bounds[0] >= bounds[2] or bounds[1] >= bounds[3]:
            return None
    box = transform_bounds(box_crs, scene_crs, *bounds, densify_pts=21)
    if not _finite(box):
        return None
    inverse = ~transform
    corners = [inverse @ (x, y) for x in (box[0], box[2]) for y in (box[1], box[3])]
    cols, rows = [c for c, _ in corners], [r for _, r in corners]
    # Whole pixels, ignoring float noise: a box on pixel edges must not grow by a pixel.
    col0, col1 = max(0, math.floor(min(cols) + EPS)), min(width, math.ceil(max(cols) - EPS))
    row0, row1 = max(0, math.floor(min(rows) + EPS)), min(height, math.ceil(max(rows) - EPS))
    if col0 >= col1 or row0 >= row1:
        return None
    return row0, col0, row1 - row0, col1 - col0


def _finite(values: Sequence[float]) -> bool:
    return all(math.isfinite(v) for v in values)


def _in_degrees(crs: CRS) -> bool:
    return crs.is_geographic and crs.units_factor[0] in ("degree", "degrees")


def _lon_lat_valid(bounds: Sequence[float]) -> bool:
    xmin, ymin, xmax, ymax = bounds
    return -LON <= xmin and xmax <= LON and -LAT <= ymin and ymax <= LAT


def _swapped(bounds: Sequence[float]) -> Tuple[float, float, float, float]:
    """[lat_min, lon_min, lat_max, lon_max] read as [lon_min, lat_min, ...]."""
    return bounds[1], bounds[0], bounds[3], bounds[2]


def _box(bounds: Sequence[float]) -> str:
    """A box as the user can type it back: `[-92.95,29.76,-92.9,29.8]` (no spaces: one shell word)."""
    return "[" + ",".join(f"{v:.10g}" for v in bounds) + "]"
