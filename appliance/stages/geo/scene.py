"""A scene as a run carries it: select bands, check grids, describe. Never reads a pixel.

`select_bands` is the pure band-selection rule; `inspect_scene` builds the `SceneInfo` a run carries
from a `SceneSpec` (one multi-band file or one file per band, local or remote, cut to an area of
interest), from headers opened and probed by `geotiff.py`. `window_reader.py` reads its windows.
"""
import logging
import os
import re
import uuid
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple, Union

from affine import Affine
from rasterio.enums import MaskFlags

from appliance.errors import InputError
from appliance.stages.geo.acquisition import Acquired, acquisition, date_tag, scene_centre
from appliance.stages.geo.aoi import Aoi, aoi_window
from appliance.stages.geo.geotiff import file_param, open_raster, probe_geotiff
from appliance.stages.geo.scene_sources import SceneSpec, shown

log = logging.getLogger(__name__)


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
    datetime: Optional[str] = None  # acquisition time (ISO 8601, UTC) when known: acquisition.py's rule
    acquired: Optional[Acquired] = None  # that time and where it came from
    centre: Optional[Tuple[float, float]] = None  # (lat, lon) of the scene's centre as run; None without a CRS
    coords: Any = None  # GeoCoords the model is given (raster_read sets them for models with coords_encoding)

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


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
    date=None,
) -> SceneInfo:
    """Validate a scene's headers for the model and describe it; reads no pixels.

    `source`: a GeoTIFF path or URL, or a `SceneSpec` (per-band files share one grid, checked here).
    Scale rule, per band: `scale` if given; else the file's own scale/offset tags when it declares
    any; else `model_scale` (the model config's DN -> reflectance factor). `date`: a given acquisition
    time (a UTC datetime), else the source's (acquisition.py).
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
    acquired = acquisition(date, spec.datetime, first.date_tag, (spec.name, *spec.files))
    if first.crs is None:
        log.warning("%s has no CRS: the mask is written without one (pixel coordinates only)", shown(spec.name))
    return SceneInfo(
        id=scene_id, key=uuid.uuid4().hex, path=shown(spec.name), width=width, height=height,
        band_indexes=tuple(b.index for b in bands), band_names=tuple(model_bands),
        scales=tuple(float(v) for v in scales), offsets=tuple(float(v) for v in offsets),
        nodata=tuple(nodata if nodata is not None else b.nodata for b in bands), nodata_fill=float(nodata_fill),
        mask_band=any(b.mask_band for b in bands), crs=first.crs, transform=transform,
        files=tuple(b.file for b in bands), offset=(row, col), labels=tuple(b.label for b in bands),
        links=spec.links, fetch=spec.fetch, datetime=acquired.when.isoformat() if acquired else None,
        acquired=acquired, centre=scene_centre(first.crs, transform, width, height),
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
    date_tag: Optional[Tuple[str, str]]  # (tag, text): acquisition.DATE_TAGS


def _band(ds, file: str, label: str, index: int) -> _Band:
    return _Band(file, label, index, ds.scales[index - 1], ds.offsets[index - 1], ds.nodatavals[index - 1],
                 MaskFlags.per_dataset in ds.mask_flag_enums[index - 1], ds.crs, ds.transform, ds.width,
                 ds.height, date_tag(ds.tags()))


def _multi_band(spec: SceneSpec, model_bands: Sequence[str], requested) -> List[_Band]:
    file, label = spec.files[0], spec.label(0)
    probe_geotiff(file, label, spec.fetch)
    with open_raster(file, label, spec.fetch) as ds:
        try:
            indexes = select_bands(requested, ds.descriptions, model_bands)
        except InputError as e:
            raise InputError(f"{label}: {e}", param=file_param(label)) from None
        return [_band(ds, file, label, i) for i in indexes]


def _per_band(spec: SceneSpec, model_bands: Sequence[str], requested) -> List[_Band]:
    """Band 1 of each file, in the model's order; every file on the first one's grid."""
    if requested:
        raise InputError("raster_read.bands picks bands of one multi-band file; per-band inputs are already "
                         "in the model's band order: drop the bands option", param="raster_read.bands")
    bands = []
    for position, (file, name) in enumerate(zip(spec.files, model_bands)):
        label = spec.label(position)
        probe_geotiff(file, label, spec.fetch)
        with open_raster(file, label, spec.fetch) as ds:
            if ds.count != 1:
                raise InputError(f"{label}: has {ds.count} bands; a per-band input is one single-band file per "
                                 f"model band ({name} here)", param=file_param(label))
            bands.append(_band(ds, file, label, 1))
    first = bands[0]
    for band in bands[1:]:
        grid, reference = _grid(band), _grid(first)
        if grid != reference:
            raise InputError(f"{band.label}: is on a different grid from {first.label} ({grid} vs {reference}); "
                             "per-band inputs must share one grid (CRS, pixel size, origin, size): resample them "
                             "first, e.g. gdalwarp -tr / -te", param=file_param(band.label))
    return bands


def _grid(band: _Band) -> str:
    t = band.transform
    crs = band.crs.to_string() if band.crs is not None else "no CRS"
    return f"{band.width}x{band.height} px of {abs(t.a):g}x{abs(t.e):g} from ({t.c:g}, {t.f:g}), {crs}"
