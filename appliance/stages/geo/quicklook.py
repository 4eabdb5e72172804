"""A small PNG: the mask's non-background classes over an RGB composite, both read decimated, with a
legend of the classes' colours below (legend.py). Its colours, band choice, stretch and decimated reads
are shared with the scene report's previews (scene_report.py)."""
from typing import List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image
from rasterio.enums import Resampling

from appliance.output_files import AtomicFile, sibling_path
from appliance.stages.geo.class_colours import NODATA_GREY, Colour
from appliance.stages.geo.geotiff import open_raster
from appliance.stages.geo.legend import legend_entries, with_legend
from appliance.stages.geo.stitch import NODATA_CLASS
from appliance.stages.geo.window_reader import open_scene
from appliance.stages.geo.band_headers import normalised_name


def quicklook_path(output_path: str) -> str:
    return sibling_path(output_path, ".quicklook.png")


def rgb_bands(scene) -> list:
    """Positions of red, green, blue among the model's bands by name; else the first band thrice."""
    by_name = {normalised_name(n): i for i, n in enumerate(scene.band_names)}
    picked = [by_name.get(c) for c in ("red", "green", "blue")]
    return picked if None not in picked else [0] * 3


def stretch(rgb: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """2-98 percentile stretch per band to uint8."""
    return stretched(rgb, stretch_ranges(rgb, valid))


def stretch_ranges(rgb: np.ndarray, valid: np.ndarray) -> List[Optional[Tuple[float, float]]]:
    """Per band, the (2nd, 98th) percentile of its `valid` values; None for a band with none."""
    ranges: List[Optional[Tuple[float, float]]] = []
    for band in range(rgb.shape[0]):
        values = rgb[band][valid]
        if values.size == 0:
            ranges.append(None)
            continue
        lo, hi = np.percentile(values, [2, 98])
        ranges.append((float(lo), float(hi)))
    return ranges


def stretched(rgb: np.ndarray, ranges: Sequence[Optional[Sequence[float]]]) -> np.ndarray:
    """Bands [3, h, w] scaled to uint8 from their (low, high): low and below 0, high and above 255; a band
    whose range is None, 0."""
    out = np.zeros(rgb.shape, dtype=np.uint8)
    for band, limits in enumerate(ranges):
        if limits is None:
            continue
        lo, hi = limits
        scaled = (rgb[band] - lo) / max(hi - lo, 1e-6)
        out[band] = (np.clip(scaled, 0, 1) * 255).astype(np.uint8)
    return out


def preview_shape(width: int, height: int, max_size: int) -> Tuple[int, int]:
    """(rows, columns) of a picture of the scene at most `max_size` pixels on its longer side, never
    larger than the scene."""
    factor = min(1.0, max_size / max(width, height))
    return max(1, round(height * factor)), max(1, round(width * factor))


def mask_classes(mask: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(class per pixel, nodata per pixel) of mask bands [B, h, w]: uint8 classes with NODATA_CLASS at nodata, or float
    probabilities per class with NaN nodata (class = argmax)."""
    if mask.dtype == np.uint8:
        return mask[0], mask[0] == NODATA_CLASS
    nodata = np.isnan(mask).any(axis=0)
    return np.nan_to_num(mask).argmax(axis=0), nodata


def read_previews(scene, mask_path: str, shape: Tuple[int, int]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The scene's RGB bands (DN, [3, h, w]) and the mask's classes and nodata at `shape`, both read
    decimated (nearest), never whole."""
    with open_scene(scene) as reader:
        rgb = reader.read_decimated(rgb_bands(scene), shape)
    with open_raster(mask_path) as mask_ds:
        mask = mask_ds.read(out_shape=(mask_ds.count, *shape), resampling=Resampling.nearest)
    return (rgb, *mask_classes(mask))


def write_quicklook(scene, mask_path: str, png_path: str, max_size: int, class_names: Sequence[str],
                    class_colours: Sequence[Colour]) -> None:
    """The picture is at most `max_size` pixels on its longer side; the legend adds a band below. Class 0
    (background: land, unburned) is left unpainted, the others take their colour from `class_colours`."""
    rgb, classes, nodata = read_previews(scene, mask_path, preview_shape(scene.width, scene.height, max_size))
    image = stretch(rgb, ~nodata).transpose(1, 2, 0).astype(np.float32)
    for cls in np.unique(classes[~nodata]):
        if cls == 0:
            continue
        hit = (classes == cls) & ~nodata
        image[hit] = 0.45 * image[hit] + 0.55 * np.asarray(class_colours[cls], dtype=np.float32)
    image[nodata] = NODATA_GREY
    with AtomicFile(png_path) as temp:
        picture = Image.fromarray(image.astype(np.uint8))
        with_legend(picture, legend_entries(class_names, class_colours, NODATA_GREY)).save(temp, format="PNG")
