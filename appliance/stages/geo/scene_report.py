"""A written mask's report for a map page: its summary (size, grid, lon/lat corners, pixels and area per
class, the acquisition date its tags record) and two previews of the same size, `scene.png` (the input's
RGB) and `mask.png` (the classes as a palette PNG, class 0 transparent, so it lays over scene.png as is),
and `scene_rgb.json`: which files and bands scene.png shows and the stretch it used, so the map's tiles
of the scene (map_tiles.py) render the input as the preview does.

The counts are taken at full resolution, strip by strip of the mask's rows (never the whole mask in
memory); the previews are read decimated (quicklook.py's reads, colours and stretch).
"""
import json
import math
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image
from rasterio.windows import Window
from rasterio.warp import transform as warp_transform, transform_bounds

from appliance.output_files import AtomicFile
from appliance.stages.geo.geotiff import open_raster
from appliance.stages.geo.class_colours import NODATA_GREY, default_colours, parse_colours_tag
from appliance.stages.geo.quicklook import (mask_classes, preview_shape, read_previews, rgb_bands, stretch_ranges,
                                            stretched)

SCENE_PNG, MASK_PNG, SCENE_RGB = "scene.png", "mask.png", "scene_rgb.json"
EARTH_RADIUS_M = 6371008.8  # the mean Earth radius (IUGG): spherical cell areas of geographic grids
GRID_POINTS = 9  # lon/lat at GRID_POINTS x GRID_POINTS points of the pixel grid; the page interpolates
STRIP_BYTES = 32 * 1024 * 1024  # one strip of mask rows read at a time while counting
LONLAT = "EPSG:4326"


def write_scene_report(scene, mask_path: str, report_dir: str, preview_size: int,
                       class_names: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Write `scene.png` and `mask.png` (longer side <= `preview_size`, never upscaled) into `report_dir`
    and return the summary. `scene`: the SceneInfo the mask was made from; `class_names`: None reads
    the names raster_write tagged the mask with. The class colours are the mask's `class_colours` tag
    (the model's, as raster_write wrote them), else the defaults."""
    with open_raster(mask_path) as ds:
        names = list(class_names) if class_names is not None else tagged_class_names(ds)
        colours = tagged_colours(ds, len(names))
        summary = grid_summary(ds)
        summary.update(class_summary(ds, names, colours))
        summary.update(acquisition_summary(ds.tags()))
    shape = preview_shape(summary["width"], summary["height"], preview_size)
    rgb, classes, nodata = read_previews(scene, mask_path, shape)
    ranges = stretch_ranges(rgb, ~nodata)
    picture = stretched(rgb, ranges).transpose(1, 2, 0).copy()
    picture[nodata] = NODATA_GREY
    positions = rgb_bands(scene)
    rendering = {"files": [scene.files[p] for p in positions], "bands": [scene.band_indexes[p] for p in positions],
                 "ranges": ranges}
    with AtomicFile(os.path.join(report_dir, SCENE_RGB)) as temp:
        with open(temp, "w") as f:
            json.dump(rendering, f)
    with AtomicFile(os.path.join(report_dir, SCENE_PNG)) as temp:
        Image.fromarray(picture).save(temp, format="PNG")
    with AtomicFile(os.path.join(report_dir, MASK_PNG)) as temp:
        palette_mask(classes, nodata, colours).save(temp, format="PNG", transparency=0)
    summary["preview"] = {"width": shape[1], "height": shape[0]}
    return summary


def acquisition_summary(tags) -> Dict[str, Optional[str]]:
    """The acquisition date raster_write tagged the mask with (acquisition.coords_tags), and its source."""
    return {"acquisition_date": tags.get("acquisition_date"),
            "acquisition_date_source": tags.get("acquisition_date_source")}


def tagged_class_names(ds) -> List[str]:
    names = ds.tags().get("class_names")
    if not names:
        raise ValueError(f"{ds.name} has no class_names tag (raster_write writes one); pass class_names")
    return names.split(",")


def tagged_colours(ds, count: int) -> List[Tuple[int, int, int]]:
    """The class colours the mask's `class_colours` tag records (the model's), else the defaults."""
    return parse_colours_tag(ds.tags().get("class_colours"), count)


def palette_mask(classes: np.ndarray, nodata: np.ndarray, colours: Sequence[Tuple[int, int, int]]) -> Image.Image:
    """Pixel = class index, nodata (and any value past the classes) = the class count; palette = `colours`
    (one per class), then NODATA_GREY. The caller saves it with `transparency=0`: class 0 shows what lies below."""
    count = len(colours)
    index = np.where(nodata | (classes >= count), count, classes).astype(np.uint8)
    image = Image.frombytes("P", (index.shape[1], index.shape[0]), np.ascontiguousarray(index).tobytes())
    image.putpalette([int(v) for colour in colours for v in colour] + list(NODATA_GREY))
    return image


def grid_summary(ds) -> Dict[str, Any]:
    """Size, CRS, transform, bounds, and lon/lat bounds and grid (None without a CRS)."""
    crs, transform = ds.crs, ds.transform
    out = {"width": ds.width, "height": ds.height, "crs": crs.to_string() if crs else None,
           "transform": [float(v) for v in tuple(transform)[:6]], "bounds": [float(v) for v in ds.bounds],
           "lonlat_bounds": None, "lonlat_grid": None}
    if crs:
        out["lonlat_bounds"] = [float(v) for v in transform_bounds(crs, LONLAT, *ds.bounds, densify_pts=21)]
        out["lonlat_grid"] = lonlat_grid(crs, transform, ds.width, ds.height)
    return out


def lonlat_grid(crs, transform, width: int, height: int, n: int = GRID_POINTS) -> Dict[str, Any]:
    """lon/lat of the pixel grid's point [i][j] at row i*height/(n-1), column j*width/(n-1)."""
    points = [transform @ (j * width / (n - 1), i * height / (n - 1)) for i in range(n) for j in range(n)]
    lon, lat = warp_transform(crs, LONLAT, [x for x, _ in points], [y for _, y in points])
    return {"size": n, "lon": [list(map(float, lon[i * n:(i + 1) * n])) for i in range(n)],
            "lat": [list(map(float, lat[i * n:(i + 1) * n])) for i in range(n)]}


def pixel_area_m2(crs, transform) -> Optional[float]:
    """A projected CRS's pixel area in square metres; None for a geographic CRS or none."""
    if not crs or not crs.is_projected:
        return None
    metres = crs.linear_units_factor[1]
    return abs(transform.a * transform.e - transform.b * transform.d) * metres ** 2


def geographic_row_areas_m2(crs, transform, height: int) -> Optional[np.ndarray]:
    """A geographic CRS's cell area per row on the sphere, R^2 |dlon| |sin(lat_top) - sin(lat_bottom)|
    (radians); None for another CRS or a rotated grid."""
    if not crs or not crs.is_geographic or transform.b or transform.d:
        return None
    radians = crs.units_factor[1]
    edges = np.clip((transform.f + transform.e * np.arange(height + 1)) * radians, -math.pi / 2, math.pi / 2)
    return EARTH_RADIUS_M ** 2 * abs(transform.a * radians) * np.abs(np.diff(np.sin(edges)))


def class_summary(ds, names: Sequence[str], colours: Optional[Sequence[Tuple[int, int, int]]] = None) -> Dict[str, Any]:
    """Pixels, area, share and colour per class (`colours`, else the defaults), valid and nodata pixels,
    counted strip by strip at full size."""
    count = len(names)
    colours = colours if colours is not None else default_colours(count)
    pixel_area = pixel_area_m2(ds.crs, ds.transform)
    row_areas = geographic_row_areas_m2(ds.crs, ds.transform, ds.height)
    pixels = np.zeros(count, dtype=np.int64)
    areas: np.ndarray = np.zeros(count, dtype=np.float64)  # m² per class; pixels x pixel area when that is fixed
    for row, rows in strips(ds):
        per_row = strip_counts(ds.read(window=Window(0, row, ds.width, rows)), count)
        pixels += per_row.sum(axis=0)
        if row_areas is not None:
            areas += (per_row * row_areas[row:row + rows, None]).sum(axis=0)
    if pixel_area is not None:
        areas = pixels * pixel_area
    has_area = pixel_area is not None or row_areas is not None
    valid = int(pixels.sum())
    classes = [{"index": i, "name": name, "colour": [int(v) for v in colours[i]], "pixels": int(pixels[i]),
                "area_km2": float(areas[i]) / 1e6 if has_area else None,
                "share": float(pixels[i]) / valid if valid else 0.0} for i, name in enumerate(names)]
    return {"classes": classes, "valid_pixels": valid, "nodata_pixels": ds.width * ds.height - valid,
            "nodata_colour": list(NODATA_GREY), "pixel_area_m2": pixel_area}


def strips(ds) -> List[Tuple[int, int]]:
    """(first row, rows) of whole-width strips of about STRIP_BYTES, a multiple of the block height."""
    block = ds.block_shapes[0][0]
    row_bytes = ds.width * ds.count * np.dtype(ds.dtypes[0]).itemsize
    rows = max(block, STRIP_BYTES // max(row_bytes, 1) // block * block)
    return [(row, min(rows, ds.height - row)) for row in range(0, ds.height, rows)]


def strip_counts(mask: np.ndarray, count: int) -> np.ndarray:
    """[rows, count] pixels of each class per row of mask bands [B, rows, W]; nodata and values past the
    classes are not counted."""
    classes, nodata = mask_classes(mask)
    valid = ~nodata & (classes < count)
    rows = np.broadcast_to(np.arange(classes.shape[0])[:, None], classes.shape)
    index = rows[valid] * count + classes[valid]
    return np.bincount(index, minlength=classes.shape[0] * count).reshape(classes.shape[0], count)
