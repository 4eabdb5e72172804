"""GeoTIFF scenes: validate headers, select bands, read windows. Never reads a whole scene.

`probe_geotiff` checks a file is a complete GeoTIFF (header and block table only);
`select_bands` is the pure band-selection rule; `inspect_scene` builds the `SceneInfo` a run
carries; `read_window` reads one window as float32 reflectance plus a validity mask.
"""
import contextlib
import logging
import os
import re
import uuid
import warnings
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import rasterio
from rasterio.enums import Interleaving, MaskFlags
from rasterio.errors import NotGeoreferencedWarning, RasterioError
from rasterio.windows import Window

from appliance.errors import InputError

log = logging.getLogger(__name__)

MAX_BLOCKS_CHECKED = 200_000  # block-table check cost is ~1 µs a block


@dataclass(frozen=True)
class SceneInfo:
    id: int  # position of the scene in the run
    key: str  # unique per inspection: keys per-scene state when many runs share a stream
    path: str
    width: int
    height: int
    band_indexes: Tuple[int, ...]  # 1-based file bands, in the model's band order
    band_names: Tuple[str, ...]  # the model's names for them
    scales: Tuple[float, ...]  # reflectance = DN * scale + offset, per selected band
    offsets: Tuple[float, ...]
    nodata: Tuple[Optional[float], ...]  # per selected band
    nodata_fill: float  # reflectance given to the model where the input is nodata
    mask_band: bool  # the file carries a GDAL mask band (0 = no data), e.g. JPEG-compressed scenes
    crs: Any  # rasterio CRS or None
    transform: Any  # affine.Affine

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


@contextlib.contextmanager
def open_raster(path: str) -> Iterator[rasterio.DatasetReader]:
    """rasterio.open without the not-georeferenced warning (we log our own) and with clear errors."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NotGeoreferencedWarning)
            dataset = rasterio.open(path)
    except RasterioError as e:
        if _looks_like_tiff(path):
            raise InputError(
                f"{path}: is truncated or corrupt ({_first_line(e)}); re-download or re-export it"
            ) from None
        raise InputError(f"{path}: cannot be read as a GeoTIFF ({_first_line(e)}); expected a .tif scene") from None
    with dataset:
        yield dataset


def _looks_like_tiff(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError:
        return False
    return magic in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")  # TIFF and BigTIFF


def probe_geotiff(path: str) -> None:
    """InputError unless `path` is a non-empty GeoTIFF whose blocks all lie inside the file."""
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise InputError(f"{path}: is not a file; expected a GeoTIFF scene")
    if not os.access(path, os.R_OK):
        raise InputError(f"{path}: is not readable (permission denied)")
    with open_raster(path) as ds:
        if ds.driver != "GTiff":
            raise InputError(f"{path}: is a {ds.driver} file, not a GeoTIFF; convert it (gdal_translate -of GTiff)")
        if ds.width < 1 or ds.height < 1 or ds.count < 1:
            raise InputError(f"{path}: is empty ({ds.width}x{ds.height} pixels, {ds.count} bands)")
        _check_blocks_inside(ds, path)


def _check_blocks_inside(ds, path: str) -> None:
    """A truncated TIFF opens fine but has blocks past the end of the file: catch it up front."""
    size = os.path.getsize(path)
    block_h, block_w = ds.block_shapes[0]
    rows, cols = -(-ds.height // block_h), -(-ds.width // block_w)
    per_band = ds.interleaving is Interleaving.band
    bands = range(1, ds.count + 1) if per_band else [1]
    if rows * cols * len(bands) > MAX_BLOCKS_CHECKED:  # huge scene: check the last row of blocks only
        cells = [(r, c) for r in [rows - 1] for c in range(cols)]
    else:
        cells = [(r, c) for r in range(rows) for c in range(cols)]
    for band in bands:
        for r, c in cells:
            offset = ds.get_tag_item(f"BLOCK_OFFSET_{c}_{r}", "TIFF", bidx=band)
            length = ds.get_tag_item(f"BLOCK_SIZE_{c}_{r}", "TIFF", bidx=band)
            if offset is None or length is None:
                return  # driver does not expose the block table (not expected for GTiff)
            if int(offset) + int(length) > size:
                raise InputError(
                    f"{path}: is truncated or corrupt (block {r},{c} of band {band} ends at byte "
                    f"{int(offset) + int(length)}, the file has {size}); re-download or re-export it"
                )


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def select_bands(
    requested: Optional[Sequence[Any]],
    descriptions: Sequence[Optional[str]],
    model_bands: Sequence[str],
) -> List[int]:
    """1-based file band indexes feeding the model's bands, in the model's order.

    `requested`: names (matched to the file's band descriptions, ignoring case and punctuation)
    or 1-based indexes; None means: the model's band names if the file names them all, else all
    the file's bands when their count equals the model's. Raises InputError (message without path).
    """
    count = len(descriptions)
    wanted = ", ".join(model_bands)
    available = ", ".join(f"{i}:{d}" if d else str(i) for i, d in enumerate(descriptions, 1))
    by_name = {_norm(d): i for i, d in enumerate(descriptions, 1) if d}
    if requested is None:
        if all(_norm(b) in by_name for b in model_bands):
            return [by_name[_norm(b)] for b in model_bands]
        if count == len(model_bands):
            return list(range(1, count + 1))
        raise InputError(
            f"has {count} bands but the model expects {len(model_bands)} ({wanted}) and the band "
            f"descriptions do not name them (bands: {available}); select them with "
            f"pipeline.stages.raster_read.bands=[names or 1-based indexes]"
        )
    indexes, missing = [], []
    for item in requested:
        text = str(item).strip()
        if re.fullmatch(r"\d+", text):
            index = int(text)
            if not 1 <= index <= count:
                raise InputError(f"has no band {index}: band indexes are 1..{count} (bands: {available})")
            indexes.append(index)
        elif _norm(text) in by_name:
            indexes.append(by_name[_norm(text)])
        else:
            missing.append(text)
    if missing:
        raise InputError(f"has no band named {', '.join(missing)} (available: {available})")
    if len(indexes) != len(model_bands):
        raise InputError(f"{len(indexes)} bands selected but the model expects {len(model_bands)} ({wanted})")
    return indexes


def inspect_scene(
    path: str,
    scene_id: int,
    model_bands: Sequence[str],
    requested: Optional[Sequence[Any]] = None,
    scale: Optional[float] = None,
    model_scale: float = 1.0,
    nodata: Optional[float] = None,
    nodata_fill: float = 0.0,
) -> SceneInfo:
    """Validate a scene's header for the model and describe it; reads no pixels.

    Scale rule: `scale` if given; else the file's own scale/offset tags when it declares any;
    else `model_scale` (the model config's DN -> reflectance factor).
    """
    probe_geotiff(path)
    with open_raster(path) as ds:
        try:
            indexes = select_bands(requested, ds.descriptions, model_bands)
        except InputError as e:
            raise InputError(f"{path}: {e}") from None
        if scale is not None:
            scales, offsets = [scale] * len(indexes), [0.0] * len(indexes)
        elif any(ds.scales[i - 1] != 1 or ds.offsets[i - 1] != 0 for i in indexes):
            scales, offsets = [ds.scales[i - 1] for i in indexes], [ds.offsets[i - 1] for i in indexes]
        else:
            scales, offsets = [model_scale] * len(indexes), [0.0] * len(indexes)
        band_nodata = [nodata if nodata is not None else ds.nodatavals[i - 1] for i in indexes]
        mask_band = any(MaskFlags.per_dataset in ds.mask_flag_enums[i - 1] for i in indexes)
        if ds.crs is None:
            log.warning("%s has no CRS: the mask is written without one (pixel coordinates only)", path)
        return SceneInfo(
            id=scene_id, key=uuid.uuid4().hex, path=str(path), width=ds.width, height=ds.height,
            band_indexes=tuple(indexes), band_names=tuple(model_bands),
            scales=tuple(float(s) for s in scales), offsets=tuple(float(o) for o in offsets),
            nodata=tuple(band_nodata), nodata_fill=float(nodata_fill), mask_band=mask_band,
            crs=ds.crs, transform=ds.transform,
        )


def read_window(ds, scene: SceneInfo, y: int, x: int, height: int, width: int) -> Tuple[np.ndarray, np.ndarray]:
    """(reflectance float32 [C,h,w] with nodata pixels set to `nodata_fill`, valid bool [h,w]).

    A pixel is invalid when any selected band is the band's nodata value or NaN, or the file's
    mask band says so.
    """
    window = Window(x, y, width, height)
    try:
        data = ds.read(list(scene.band_indexes), window=window, out_dtype="float32")
        masked = ds.read_masks(scene.band_indexes[0], window=window) == 0 if scene.mask_band else None
    except RasterioError as e:
        raise InputError(
            f"{scene.path}: cannot read the window of rows {y}..{y + height - 1}, columns {x}..{x + width - 1} "
            f"({_first_line(e)}); the file may be truncated or corrupt"
        ) from None
    invalid = np.isnan(data).any(axis=0)
    if masked is not None:
        invalid |= masked
    for band, value in enumerate(scene.nodata):
        if value is not None and not np.isnan(value):
            invalid |= data[band] == np.float32(value)
    scales = np.asarray(scene.scales, dtype=np.float32)[:, None, None]
    offsets = np.asarray(scene.offsets, dtype=np.float32)[:, None, None]
    data *= scales
    data += offsets
    data[:, invalid] = scene.nodata_fill
    return data, ~invalid


def _first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__
