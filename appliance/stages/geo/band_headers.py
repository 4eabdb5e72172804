"""The model's bands as a scene's file headers hold them: one multi-band file (bands picked by
`select_bands`), one single-band file per model band, or one stacked file holding several dates.
Reads headers only; `scene.py` builds a run's `SceneInfo` from them, `multidate.py` several dates'.
"""
import re
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

from rasterio.enums import MaskFlags

from appliance.errors import InputError
from appliance.stages.geo.acquisition import date_tag
from appliance.stages.geo.geotiff import file_param, open_raster, probe_geotiff
from appliance.stages.geo.scene_sources import SceneSpec


@dataclass(frozen=True)
class BandHeader:
    """One model band as found in its file's header."""
    file: str
    label: str
    index: int  # 1-based band of `file`
    scale: float
    offset: float
    nodata: Optional[float]
    mask_band: bool
    crs: Any
    transform: Any
    width: int
    height: int
    date_tag: Optional[Tuple[str, str]]  # (tag, text): acquisition.DATE_TAGS
    count: int  # bands in `file`


def normalised_name(name: str) -> str:
    """A band name for matching: lower case, letters and digits only (`NIR_Narrow` -> `nirnarrow`)."""
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
    by_name = {normalised_name(d): i for i, d in enumerate(descriptions, 1) if d}
    if requested is None:
        if all(normalised_name(b) in by_name for b in model_bands):
            return [by_name[normalised_name(b)] for b in model_bands]
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
        elif normalised_name(text) in by_name:
            indexes.append(by_name[normalised_name(text)])
        else:
            missing.append(text)
    if missing:
        raise InputError(f"has no band named {', '.join(missing)} (available: {available})")
    if len(indexes) != len(model_bands):
        raise InputError(f"{len(indexes)} bands selected but the model expects {len(model_bands)} ({wanted})")
    return indexes


def band_header(ds, file: str, label: str, index: int) -> BandHeader:
    return BandHeader(file, label, index, ds.scales[index - 1], ds.offsets[index - 1], ds.nodatavals[index - 1],
                      MaskFlags.per_dataset in ds.mask_flag_enums[index - 1], ds.crs, ds.transform, ds.width,
                      ds.height, date_tag(ds.tags()), ds.count)


def scene_bands(spec: SceneSpec, model_bands: Sequence[str], requested) -> List[BandHeader]:
    """The model's bands of a one-date scene, in the model's order."""
    return per_band(spec, model_bands, requested) if spec.per_band else multi_band(spec, model_bands, requested)


def multi_band(spec: SceneSpec, model_bands: Sequence[str], requested) -> List[BandHeader]:
    file, label = spec.files[0], spec.label(0)
    probe_geotiff(file, label, spec.fetch)
    with open_raster(file, label, spec.fetch) as ds:
        try:
            indexes = select_bands(requested, ds.descriptions, model_bands)
        except InputError as e:
            raise InputError(f"{label}: {e}", param=file_param(label)) from None
        return [band_header(ds, file, label, i) for i in indexes]


def per_band(spec: SceneSpec, model_bands: Sequence[str], requested) -> List[BandHeader]:
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
            bands.append(band_header(ds, file, label, 1))
    first = bands[0]
    for band in bands[1:]:
        grid, reference = grid_text(band), grid_text(first)
        if grid != reference:
            raise InputError(f"{band.label}: is on a different grid from {first.label} ({grid} vs {reference}); "
                             "per-band inputs must share one grid (CRS, pixel size, origin, size): resample them "
                             "first, e.g. gdalwarp -tr / -te", param=file_param(band.label))
    return bands


def grid_text(band: BandHeader) -> str:
    t = band.transform
    crs = band.crs.to_string() if band.crs is not None else "no CRS"
    return f"{band.width}x{band.height} px of {abs(t.a):g}x{abs(t.e):g} from ({t.c:g}, {t.f:g}), {crs}"
