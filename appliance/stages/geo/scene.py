"""A scene as a run carries it: select bands, check grids, describe. Never reads a pixel.

`inspect_scene` builds the `SceneInfo` a run carries from a `SceneSpec` (one multi-band file or one file
per band, local or remote, cut to an area of interest; for a multi-date model several dates or one stacked
file, multidate.py), from headers (band_headers.py). `window_reader.py` reads its windows.
"""
import logging
import os
import uuid
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple, Union

from affine import Affine

from appliance.stages.geo.acquisition import Acquired, acquisition, scene_centre
from appliance.stages.geo.aoi import Aoi, aoi_window
from appliance.stages.geo.band_headers import scene_bands
from appliance.stages.geo.multidate import check_dates, stacked_bands
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
    # Per model band, date after date for a multi-date scene (T x C entries), the GDAL path holding it (one
    # path repeated: a multi-band file); band_indexes .. nodata and labels follow the same order.
    files: Tuple[str, ...] = ()
    offset: Tuple[int, int] = (0, 0)  # (row, column) of the scene's first pixel in the files' grid
    labels: Tuple[str, ...] = ()  # per model band, how messages name its file
    fetch: Any = None  # SceneSpec.fetch: a RemoteReads when remote files go through the fetcher
    links: Tuple[str, ...] = ()  # what the mask is derived from (files, URLs, a STAC item), for its STAC item
    datetime: Optional[str] = None  # acquisition time (ISO 8601, UTC) when known: acquisition.py's rule
    acquired: Optional[Acquired] = None  # that time and where it came from
    centre: Optional[Tuple[float, float]] = None  # (lat, lon) of the scene's centre as run; None without a CRS
    coords: Any = None  # GeoCoords the model is given (raster_read sets them for models with coords_encoding)
    frames: int = 1  # T: dates of the scene (model.prithvi.num_frames); the tile stage gives [C, T, h, w]
    acquisitions: Tuple[Optional[Acquired], ...] = ()  # per date (`acquired` is date 1's)
    date_paths: Tuple[str, ...] = ()  # a multi-date scene's dates' sources, as shown (date 1's is `path`)
    warped: Tuple[str, ...] = ()  # files read warped onto date 1's grid (raster_read.resample), with `resampling`
    resampling: Optional[str] = None

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    @property
    def title(self) -> str:
        """How progress names the scene: every date's source of a multi-date scene (`a.tif + b.tif + c.tif`),
        where `name` (date 1's) names its outputs."""
        return " + ".join(os.path.basename(path) for path in self.date_paths) or self.name


def inspect_scene(
    source: Union[str, SceneSpec],
    scene_id: int,
    model_bands: Sequence[str],
    requested: Optional[Sequence[Any]] = None,
    scale: Optional[float] = None,
    model_scale: float = 1.0,
    nodata: Optional[float] = None,
    *,
    nodata_fill: float,  # the raster_read stage's option: its one default is there
    aoi: Optional[Aoi] = None,
    date=None,
    frames: int = 1,
    stacked_order: str = "date_major",
    resample: Optional[str] = None,
) -> SceneInfo:
    """Validate a scene's headers for the model and describe it; reads no pixels.

    `source`: a GeoTIFF path or URL, or a `SceneSpec` (per-band files share one grid, checked here).
    Scale rule, per band: `scale` if given; else the file's own scale/offset tags when it declares
    any; else `model_scale` (the model config's DN -> reflectance factor). `date`: a given acquisition
    time (a UTC datetime; for `frames` > 1 a tuple, one per date), else the source's (acquisition.py).
    `frames` > 1: a spec with `dates` (checked by multidate.check_dates, warped with `resample`) or one
    stacked file of frames x bands in `stacked_order`.
    """
    spec = source if isinstance(source, SceneSpec) else SceneSpec(str(source), (str(source),), False,
                                                                  links=(shown(str(source)),))
    warped: Tuple[str, ...] = ()
    if spec.dates:
        bands, warped = check_dates(spec, model_bands, requested, resample)
    elif frames > 1:
        bands = stacked_bands(spec, frames, model_bands, stacked_order, requested)
    else:
        bands = scene_bands(spec, model_bands, requested)
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
    acquisitions = _acquisitions(spec, bands, date, frames, len(model_bands))
    acquired = acquisitions[0]
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
        acquired=acquired, centre=scene_centre(first.crs, transform, width, height), frames=frames,
        acquisitions=acquisitions, date_paths=tuple(shown(d.name) for d in spec.dates), warped=warped,
        resampling=resample if warped else None,
    )


def _acquisitions(spec: SceneSpec, bands, date, frames: int, per_date: int) -> Tuple[Optional[Acquired], ...]:
    """Each date's acquisition: the given one, else its source's (a STAC item's datetime, its first band's
    date tag, its file name); a stacked file's dates only as given."""
    if frames == 1:
        return (acquisition(date, spec.datetime, bands[0].date_tag, (spec.name, *spec.files)),)
    given = date or (None,) * frames
    if not spec.dates:
        return tuple(acquisition(when, None, None, ()) for when in given)
    return tuple(acquisition(when, d.datetime, bands[i * per_date].date_tag, (d.name, *d.files))
                 for i, (when, d) in enumerate(zip(given, spec.dates)))
