"""GeoTIFF scenes: validate headers, select bands, check grids. Never reads a pixel.

`probe_geotiff` checks a file is a complete GeoTIFF (header and block table only; a remote file's
header); `select_bands` is the pure band-selection rule; `inspect_scene` builds the `SceneInfo` a run
carries from a `SceneSpec` (one multi-band file or one file per band, local or remote, cut to an
area of interest). `reader.py` reads its windows.
"""
import contextlib
import logging
import os
import re
import uuid
import warnings
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Sequence, Tuple, Union

import rasterio
from affine import Affine
from rasterio.enums import Interleaving, MaskFlags
from rasterio.errors import NotGeoreferencedWarning, RasterioError

from appliance.errors import InputError
from appliance.stages.geo.aoi import Aoi, aoi_window
from appliance.stages.geo.sources import SceneSpec, gdal_path, is_remote, scheme, shown

log = logging.getLogger(__name__)

MAX_BLOCKS_CHECKED = 200_000  # block-table check cost is ~1 µs a block


@dataclass(frozen=True)
class SceneInfo:
    id: int  # position of the scene in the run
    key: str  # unique per inspection: keys per-scene state when many runs share a stream
    path: str  # the input as the user named it (a file, URL or STAC item; messages, the mask's source tag)
    width: int  # of the scene as run: the area of interest when one is given
    height: int
    band_indexes: Tuple[int, ...]  # 1-based file bands, in the model's band order
    band_names: Tuple[str, ...]  # the model's names for them
    scales: Tuple[float, ...]  # reflectance = DN * scale + offset, per selected band
    offsets: Tuple[float, ...]
    nodata: Tuple[Optional[float], ...]  # per selected band
    nodata_fill: float  # reflectance given to the model where the input is nodata
    mask_band: bool  # the file carries a GDAL mask band (0 = no data), e.g. JPEG-compressed scenes
    crs: Any  # rasterio CRS or None
    transform: Any  # affine.Affine of the scene as run
    files: Tuple[str, ...] = ()  # per model band, the GDAL path holding it (one path repeated: a multi-band file)
    offset: Tuple[int, int] = (0, 0)  # (row, column) of the scene's first pixel in the files' grid
    labels: Tuple[str, ...] = ()  # per model band, how messages name its file
    fetch: Any = None  # SceneSpec.fetch: a RemoteReads when remote files go through the fetcher
    links: Tuple[str, ...] = ()  # what the mask is derived from (files, URLs, a STAC item), for its STAC item
    datetime: Optional[str] = None  # acquisition time when the source says (ISO 8601 or TIFFTAG_DATETIME)

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


# GDAL's options while a remote file is open (scoped to the reader, never os.environ): no directory
# listing probes next to the file, bounded waits with retries, adjacent block ranges merged.
REMOTE_OPTIONS = dict(GDAL_DISABLE_READDIR_ON_OPEN="EMPTY_DIR", GDAL_HTTP_CONNECTTIMEOUT=10, GDAL_HTTP_TIMEOUT=60,
                      GDAL_HTTP_MAX_RETRY=2, GDAL_HTTP_RETRY_DELAY=0.5, GDAL_HTTP_MERGE_CONSECUTIVE_RANGES="YES",
                      CPL_VSIL_CURL_ALLOWED_EXTENSIONS=".tif,.tiff,.TIF,.TIFF")


@contextlib.contextmanager
def open_raster(path: str, label: Optional[str] = None, fetch=None) -> Iterator[rasterio.DatasetReader]:
    """rasterio.open without the not-georeferenced warning (we log our own) and with clear errors. `path`
    may be a URL (https://, s3://), read by range requests with REMOTE_OPTIONS in force while it is open;
    with `fetch` (serve mode: the request's `remote_file.RemoteReads`) through the SSRF-safe fetcher.
    `label` names it in messages (default: the path, or the URL without its query string)."""
    remote = is_remote(path)
    name = label or shown(path)
    with contextlib.ExitStack() as stack:
        if remote:
            stack.enter_context(rasterio.Env(**REMOTE_OPTIONS))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", NotGeoreferencedWarning)
                fetched = fetch and scheme(path) in ("http", "https")  # s3: GDAL's /vsis3/, buckets checked before
                dataset = _open_remote(path, name, fetch) if fetched else rasterio.open(gdal_path(path))
        except RasterioError as e:
            if remote:
                where = f"{fetch.field}: {name}" if fetch else name  # serve mode: the request's field leads
                raise InputError(f"{where}: cannot be opened ({_first_line(e)}); the URL must answer HTTP range "
                                 "requests with a GeoTIFF (for s3://, set AWS_* credentials in the environment)"
                                 ) from None
            if _looks_like_tiff(path):
                raise InputError(
                    f"{name}: is truncated or corrupt ({_first_line(e)}); re-download or re-export it"
                ) from None
            raise InputError(f"{name}: cannot be read as a GeoTIFF ({_first_line(e)}); expected a .tif scene") from None
        with dataset:
            yield dataset


def _open_remote(url: str, name: str, fetch) -> rasterio.DatasetReader:
    from appliance.stages.geo.remote_file import opener_for

    errors: List[InputError] = []
    try:
        return rasterio.open(url, opener=opener_for(url, fetch, errors))
    except RasterioError as e:
        if errors:
            raise errors[-1] from None
        raise InputError(f"{fetch.field}: {name}: cannot be read as a GeoTIFF ({_first_line(e)})") from None


def _looks_like_tiff(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError:
        return False
    return magic in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")  # TIFF and BigTIFF


def probe_geotiff(path: str, label: Optional[str] = None, fetch=None) -> None:
    """InputError unless `path` is a non-empty GeoTIFF whose blocks all lie inside the file (for a URL:
    whose header reads; a truncated remote file fails at its first missing block, before any output)."""
    if is_remote(path):
        with open_raster(path, label, fetch) as ds:
            _check_header(ds, label or shown(path))
        return
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise InputError(f"{path}: is not a file; expected a GeoTIFF scene")
    if not os.access(path, os.R_OK):
        raise InputError(f"{path}: is not readable (permission denied)")
    with open_raster(path, label) as ds:
        _check_header(ds, label or path)
        _check_blocks_inside(ds, path)


def _check_header(ds, name: str) -> None:
    if ds.driver != "GTiff":
        raise InputError(f"{name}: is a {ds.driver} file, not a GeoTIFF; convert it (gdal_translate -of GTiff)")
    if ds.width < 1 or ds.height < 1 or ds.count < 1:
        raise InputError(f"{name}: is empty ({ds.width}x{ds.height} pixels, {ds.count} bands)")


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
    source: Union[str, SceneSpec],
    scene_id: int,
    model_bands: Sequence[str],
    requested: Optional[Sequence[Any]] = None,
    scale: Optional[float] = None,
    model_scale: float = 1.0,
    nodata: Optional[float] = None,
    nodata_fill: float = 0.0,
    aoi: Optional[Aoi] = None,
) -> SceneInfo:
    """Validate a scene's headers for the model and describe it; reads no pixels.

    `source`: a GeoTIFF path or URL, or a `SceneSpec` (per-band files share one grid, checked here).
    Scale rule, per band: `scale` if given; else the file's own scale/offset tags when it declares
    any; else `model_scale` (the model config's DN -> reflectance factor).
    """
    spec = source if isinstance(source, SceneSpec) else SceneSpec(str(source), (str(source),), False,
                                                                  links=(shown(str(source)),))
    bands = _per_band(spec, model_bands, requested) if spec.per_band else _multi_band(spec, model_bands, requested)
    first = bands[0]
    if scale is not None:
        scales, offsets = [scale] * len(bands), [0.0] * len(bands)
    elif any(b.scale != 1 or b.offset != 0 for b in bands):
        scales, offsets = [b.scale for b in bands], [b.offset for b in bands]
    else:
        scales, offsets = [model_scale] * len(bands), [0.0] * len(bands)
    row, col, height, width = 0, 0, first.height, first.width
    transform = first.transform
    if aoi is not None:
        row, col, height, width = aoi_window(aoi, first.crs, first.transform, first.width, first.height, spec.name)
        transform = first.transform @ Affine.translation(col, row)
    if first.crs is None:
        log.warning("%s has no CRS: the mask is written without one (pixel coordinates only)", shown(spec.name))
    return SceneInfo(
        id=scene_id, key=uuid.uuid4().hex, path=shown(spec.name), width=width, height=height,
        band_indexes=tuple(b.index for b in bands), band_names=tuple(model_bands),
        scales=tuple(float(v) for v in scales), offsets=tuple(float(v) for v in offsets),
        nodata=tuple(nodata if nodata is not None else b.nodata for b in bands), nodata_fill=float(nodata_fill),
        mask_band=any(b.mask_band for b in bands), crs=first.crs, transform=transform,
        files=tuple(b.file for b in bands), offset=(row, col), labels=tuple(b.label for b in bands),
        links=spec.links, datetime=spec.datetime or first.datetime, fetch=spec.fetch,
    )


@dataclass(frozen=True)
class _Band:
    """One model band as found in its file's header."""
    file: str
    label: str
    index: int
    scale: float
    offset: float
    nodata: Optional[float]
    mask_band: bool
    crs: Any
    transform: Any
    width: int
    height: int
    datetime: Optional[str]


def _band(ds, file: str, label: str, index: int) -> _Band:
    return _Band(file, label, index, ds.scales[index - 1], ds.offsets[index - 1], ds.nodatavals[index - 1],
                 MaskFlags.per_dataset in ds.mask_flag_enums[index - 1], ds.crs, ds.transform, ds.width,
                 ds.height, ds.tags().get("TIFFTAG_DATETIME"))


def _multi_band(spec: SceneSpec, model_bands: Sequence[str], requested) -> List[_Band]:
    file, label = spec.files[0], spec.label(0)
    probe_geotiff(file, label, spec.fetch)
    with open_raster(file, label, spec.fetch) as ds:
        try:
            indexes = select_bands(requested, ds.descriptions, model_bands)
        except InputError as e:
            raise InputError(f"{label}: {e}") from None
        return [_band(ds, file, label, i) for i in indexes]


def _per_band(spec: SceneSpec, model_bands: Sequence[str], requested) -> List[_Band]:
    """Band 1 of each file, in the model's order; every file on the first one's grid."""
    if requested:
        raise InputError("raster_read.bands picks bands of one multi-band file; per-band inputs are already "
                         "in the model's band order: drop the bands option")
    bands = []
    for position, (file, name) in enumerate(zip(spec.files, model_bands)):
        label = spec.label(position)
        probe_geotiff(file, label, spec.fetch)
        with open_raster(file, label, spec.fetch) as ds:
            if ds.count != 1:
                raise InputError(f"{label}: has {ds.count} bands; a per-band input is one single-band file per "
                                 f"model band ({name} here)")
            bands.append(_band(ds, file, label, 1))
    first = bands[0]
    for band in bands[1:]:
        grid, reference = _grid(band), _grid(first)
        if grid != reference:
            raise InputError(f"{band.label}: is on a different grid from {first.label} ({grid} vs {reference}); "
                             "per-band inputs must share one grid (CRS, pixel size, origin, size): resample them "
                             "first, e.g. gdalwarp -tr / -te")
    return bands


def _grid(band: _Band) -> str:
    t = band.transform
    crs = band.crs.to_string() if band.crs is not None else "no CRS"
    return f"{band.width}x{band.height} px of {abs(t.a):g}x{abs(t.e):g} from ({t.c:g}, {t.f:g}), {crs}"


def _first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__
