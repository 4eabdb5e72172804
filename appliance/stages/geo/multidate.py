"""Multi-date scenes: T acquisitions of one place for a model with `model.prithvi.num_frames` = T > 1.

One place to turn an input spec into a multi-date scene and check it, shared by `raster_inputs` /
`raster_read` and the server's routes. A scene for such a model is either
  - a list of T dates in time order, each what a one-date scene can be: a GeoTIFF path or URL, a STAC
    item, or a list of per-band files (`multidate_spec`); or
  - one stacked GeoTIFF of T x C bands laid out as `model.geo.stacked_band_order` says (`stacked_indexes`:
    date_major = all bands of date 1, then date 2, ...; band_major = band 1 of every date, then band 2 ...).
How `input` splits into scenes (`input_scenes`): a string is one scene (a stacked file); a flat list of T
entries is ONE scene (its dates); a list of lists is one scene per inner list (an inner list of one: a
stacked file).

Checks (`check_dates`, headers only): every date has the model's bands, and the same CRS, grid (transform
and size) and band count as date 1; a date on another grid is refused naming it, unless the reading stage's
`resample` option names a method: then it is warped onto date 1's grid as it is read (window_reader.py).
`parse_dates`: `date=[d1, ..., dT]` gives each date's acquisition time explicitly (`given_dates`: the rule
for any model, one date or T). The server's routes (`serving/http/routes_pool.py`, `routes_scenes.py`)
check a request's dates with `check_date_count` and `given_dates` before it queues; its engine process
builds the scene with `multidate_spec` / `dates_spec` (stages/geo/served_scenes.py).
"""
from typing import Any, Callable, List, Optional, Sequence, Tuple

from appliance.errors import InputError
from appliance.stages.geo.acquisition import parse_date
from appliance.stages.geo.band_headers import BandHeader, band_header, grid_text, scene_bands
from appliance.stages.geo.geotiff import file_param, open_raster, probe_geotiff
from appliance.stages.geo.scene_sources import SceneSpec, scene_spec, shown


def model_frames(cfg) -> int:
    """T: the acquisitions per scene the configured model takes (`model.prithvi.num_frames`, default 1)."""
    model = cfg.get("model") if cfg is not None else None
    prithvi = model.get("prithvi") if model is not None else None
    return int(prithvi.get("num_frames") or 1) if prithvi is not None else 1


def model_bands(cfg) -> List[str]:
    """The configured model's band names (`model.geo.bands`); [] for a model without a geo contract."""
    model = cfg.get("model") if cfg is not None else None
    geo = model.get("geo") if model is not None else None
    return list(geo.bands) if geo is not None else []


def input_scenes(values: Sequence[Any], frames: int) -> List[Any]:
    """`input`'s scenes for a T-date model: a flat list (strings only) is one scene of its dates; a list of
    lists is a scene per inner list; a lone string is one stacked file."""
    if frames > 1 and len(values) > 1 and all(isinstance(v, str) for v in values):
        return [list(values)]
    return list(values)


def multidate_spec(value: Any, frames: int, stac_bands: Optional[Sequence[str]], model_bands: Sequence[str],
                   load_item: Callable[[str], dict], field: str = "input", date_fields: bool = False) -> SceneSpec:
    """One scene of a T-date model: a stacked file (a path / URL) or a list of T dates; InputError naming
    `field` when the count of dates is not T. `date_fields`: a date's own problems name `field[i]` (a
    server request's list), else `field`."""
    if isinstance(value, (list, tuple)) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]  # `[[a.tif], [b.tif]]`: two stacked files
    if not isinstance(value, (list, tuple)):
        spec = scene_spec(value, stac_bands, model_bands, load_item, field)
        if spec.per_band:
            raise InputError(f"{field}: {shown(str(value))} is a STAC item, but the model takes {frames} dates; give "
                             f"{frames} items as a list, one per date, in time order", param=field)
        return spec  # a stacked file: its bands are checked against T x bands when its header is read
    check_date_count(value, frames, model_bands, field)
    return dates_spec([scene_spec(date, stac_bands, model_bands, load_item, f"{field}[{i}]" if date_fields else field)
                       for i, date in enumerate(value)])


def check_date_count(value: Sequence[Any], frames: int, model_bands: Sequence[str], field: str = "input",
                     shown_as: Callable[[str], str] = shown) -> None:
    """InputError naming `field` unless the list `value` holds exactly T dates (`shown_as`: how a message
    names a date: a server names base64 uploads by their place, not their bytes)."""
    if len(value) == frames:
        return
    shown_dates = ", ".join(shown_as(d) if isinstance(d, str) else "[" + ", ".join(map(shown_as, d)) + "]"
                            for d in value)
    raise InputError(f"{field}: {len(value)} dates given ({shown_dates}) but the model takes {frames} "
                     f"acquisitions of one place: give exactly {frames}, in time order, or one stacked GeoTIFF "
                     f"of {frames} x {len(model_bands)} bands", param=field)


def dates_spec(dates: Sequence[SceneSpec]) -> SceneSpec:
    """One scene of the given dates (each a one-date SceneSpec, in time order); date 1 names it."""
    dates = tuple(dates)
    return SceneSpec(
        name=dates[0].name, files=tuple(f for d in dates for f in d.files), per_band=False,
        labels=tuple(d.label(i) for d in dates for i in range(len(d.files))),
        links=tuple(link for d in dates for link in d.links), dates=dates,
    )


def given_dates(value: Any, frames: int, field: str = "date"):
    """`date=` for the configured model: one date (parse_date) for a one-date model, which refuses a list;
    T dates (parse_dates) for a T-date model. The CLI's rule, and the server's for `data.date` / `?date=`."""
    if frames > 1:
        return parse_dates(value, frames, field)
    if isinstance(value, (list, tuple)):
        raise InputError(f"{field}: {len(value)} dates given but the model takes one acquisition; give one date "
                         "YYYY-MM-DD", param=field)
    return parse_date(value, field)


def parse_dates(value: Any, frames: int, field: str = "date"):
    """`date=` for a T-date model: None, or a tuple of T UTC datetimes (a list of T dates, in order)."""
    if value is None or value == "" or value == []:
        return None
    if not isinstance(value, (list, tuple)):
        raise InputError(f"{field}: the model takes {frames} dates, one per acquisition; give "
                         f"{field}=[YYYY-MM-DD,...] with {frames} dates in the order of the inputs", param=field)
    if len(value) != frames:
        raise InputError(f"{field}: {len(value)} dates given but the model takes {frames} acquisitions; give "
                         f"{frames}, in the order of the inputs", param=field)
    return tuple(parse_date(v, field) for v in value)


def stacked_indexes(order: str, frames: int, bands: int) -> List[int]:
    """1-based bands of a stacked file, date after date (each date's in the model's band order)."""
    if order == "band_major":
        return [band * frames + date + 1 for date in range(frames) for band in range(bands)]
    return [date * bands + band + 1 for date in range(frames) for band in range(bands)]


def stacked_bands(spec: SceneSpec, frames: int, model_bands: Sequence[str], order: str,
                  requested) -> List[BandHeader]:
    """The T x C bands of one stacked GeoTIFF, date after date; InputError when its band count is not T x C."""
    if requested:
        raise InputError("raster_read.bands picks bands of a one-date file; a stacked multi-date file is read by "
                         "model.geo.stacked_band_order: drop the bands option", param="raster_read.bands")
    file, label = spec.files[0], spec.label(0)
    probe_geotiff(file, label, spec.fetch)
    with open_raster(file, label, spec.fetch) as ds:
        wanted = frames * len(model_bands)
        if ds.count != wanted:
            raise InputError(f"{label}: has {ds.count} bands, but a stacked file for this model holds {frames} dates "
                             f"x {len(model_bands)} bands ({', '.join(model_bands)}) = {wanted}, {order}; or give "
                             f"the {frames} dates as a list of files", param=file_param(label))
        return [band_header(ds, file, label, i) for i in stacked_indexes(order, frames, len(model_bands))]


def check_dates(spec: SceneSpec, model_bands: Sequence[str], requested,
                resample: Optional[str]) -> Tuple[List[BandHeader], Tuple[str, ...]]:
    """Every date's bands (date after date) and the files to warp onto date 1's grid (none unless
    `resample`). InputError naming the first date that differs from date 1 in CRS, grid or band count."""
    per_date = [scene_bands(date, model_bands, requested) for date in spec.dates]
    first = per_date[0][0]
    warped: List[str] = []
    for number, bands in enumerate(per_date[1:], 2):
        band = bands[0]
        if band.count != first.count:
            raise InputError(f"{band.label}: date {number} has {band.count} bands but date 1 ({first.label}) has "
                             f"{first.count}; every date of a scene must have the same bands",
                             param=file_param(band.label))
        same_crs = (band.crs is None) == (first.crs is None) and (band.crs is None or band.crs == first.crs)
        same_grid = same_crs and (band.transform, band.width, band.height) == (first.transform, first.width,
                                                                               first.height)
        if same_grid:
            continue
        if resample is None:
            what = "CRS" if not same_crs else "grid"
            raise InputError(f"{band.label}: date {number} is on another {what} than date 1 ({first.label}): "
                             f"{grid_text(band)} vs {grid_text(first)}; the dates of a scene must share one grid, or "
                             "set pipeline.stages.raster_read.resample=bilinear (or nearest, cubic, average, mode) "
                             "to warp them onto date 1's", param=file_param(band.label))
        if band.crs is None or first.crs is None:
            raise InputError(f"{band.label}: cannot be resampled onto date 1's grid without a CRS on both",
                             param=file_param(band.label))
        warped.extend(dict.fromkeys(b.file for b in bands))
    return [b for bands in per_date for b in bands], tuple(warped)
