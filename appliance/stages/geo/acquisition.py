"""When and where a scene was taken, and the coordinates a TL model's encoders take from that.

Date, first found: the run's own `date=` (a server request's `data.date` / `?date=`); a STAC item's
`datetime` (or `start_datetime`); the file's tags `ACQUISITION_DATE`, `SENSING_TIME` (HLS; the first of a
`;`-separated list), `TIFFTAG_DATETIME`; an HLS-style file name (`...2024100T165849...`: year and day of
year, or `20240409T165849`), as Prithvi-EO-2.0's own inference script reads it. Timestamps are taken in
UTC. Place: the centre of the scene as run (the area of interest's window when one is given) carried to
EPSG:4326, as rasterio's `lnglat()`; none without a CRS.

Prithvi-EO-2.0 TL encoders take `temporal_coords` [B, T, 2] = (year, day of year, 1-based as
`tm_yday`) and `location_coords` [B, 2] = (lat, lon), float32 (`model_coords` builds one scene's).
"""
import datetime as dt
import logging
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import torch
from rasterio.warp import transform as warp_transform

from appliance.engine.geo_coords import GeoCoords
from appliance.errors import InputError

log = logging.getLogger(__name__)

DATE_TAGS = ("ACQUISITION_DATE", "SENSING_TIME", "TIFFTAG_DATETIME")  # HLS's first, then TIFF's own
_WHEN = re.compile(r"(\d{4})[-:](\d{2})[-:](\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2})(?:\.\d+)?)?)?"
                   r"\s*(Z|[+-]\d{2}:?\d{2})?")
_NAME = re.compile(r"(?<!\d)(\d{4})(\d{3}|\d{4})T\d{6}(?!\d)")  # HLS: 2024100T165849; also 20240409T165849
DATE_HINT = "give a date as YYYY-MM-DD (e.g. 2024-06-30) or an ISO 8601 time (2024-06-30T16:58:49Z)"


@dataclass(frozen=True)
class Acquired:
    when: dt.datetime  # UTC
    source: str  # where it came from, for the log and the mask's tags

    @property
    def date(self) -> str:
        return self.when.date().isoformat()


def parse_when(text: Any) -> Optional[dt.datetime]:
    """A timestamp as sources write it (ISO 8601, `YYYY:MM:DD HH:MM:SS`, a bare date; the first of a
    `;`-separated list), in UTC; None when it is not one."""
    if not isinstance(text, str):
        return None
    match = _WHEN.fullmatch(text.split(";")[0].strip())
    if match is None:
        return None
    year, month, day, hour, minute, second, zone = match.groups()
    try:
        when = dt.datetime(int(year), int(month), int(day), int(hour or 0), int(minute or 0), int(second or 0))
    except ValueError:  # 2024-02-30
        return None
    if zone in (None, "Z"):
        return when.replace(tzinfo=dt.timezone.utc)
    sign = 1 if zone[0] == "+" else -1
    digits = zone[1:].replace(":", "")
    offset = dt.timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
    return when.replace(tzinfo=dt.timezone(sign * offset)).astimezone(dt.timezone.utc)


def parse_date(value: Any, field: str) -> Optional[dt.datetime]:
    """An explicitly given date (`date=`, `data.date`): None when not given; InputError naming `field`."""
    if value is None or value == "":
        return None
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    if isinstance(value, dt.date):
        return dt.datetime(value.year, value.month, value.day, tzinfo=dt.timezone.utc)
    when = parse_when(value) if isinstance(value, str) else None
    if when is None:
        raise InputError(f"{field}: {value!r} is not a date; {DATE_HINT}", param=field)
    return when


def date_tag(tags: Mapping[str, str]) -> Optional[Tuple[str, str]]:
    """(tag, text) of the first date tag a file carries that reads as a date."""
    for tag in DATE_TAGS:
        if parse_when(tags.get(tag)) is not None:
            return tag, tags[tag]
    return None


def name_date(path: str) -> Optional[dt.datetime]:
    """The date in an HLS-style file name (`HLS.S30.T15RYP.2024100T165849.v2.0.B02.tif`), else None."""
    match = _NAME.search(os.path.basename(path))
    if match is None:
        return None
    year, day = int(match.group(1)), match.group(2)
    try:
        if len(day) == 3:
            return dt.datetime(year, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(days=int(day) - 1)
        return dt.datetime(year, int(day[:2]), int(day[2:]), tzinfo=dt.timezone.utc)
    except (ValueError, OverflowError):
        return None


def acquisition(given: Optional[dt.datetime], item_datetime: Optional[str], tag: Optional[Tuple[str, str]],
                names: Sequence[str]) -> Optional[Acquired]:
    """The scene's date by the order in the module docstring."""
    if given is not None:
        return Acquired(given.astimezone(dt.timezone.utc), "date given")
    when = parse_when(item_datetime)
    if when is not None:
        return Acquired(when, "STAC datetime")
    if tag is not None:
        when = parse_when(tag[1])  # date_tag keeps only a tag that reads as a date
        if when is not None:
            return Acquired(when, f"{tag[0]} tag")
    for name in names:
        when = name_date(name)
        if when is not None:
            return Acquired(when, "file name")
    return None


def scene_centre(crs, transform, width: int, height: int) -> Optional[Tuple[float, float]]:
    """(lat, lon) in degrees of the centre of a `width` x `height` grid; None without a CRS."""
    if crs is None:
        return None
    x, y = transform @ (width / 2, height / 2)
    lons, lats = warp_transform(crs, "EPSG:4326", [x], [y])
    if not (math.isfinite(lats[0]) and math.isfinite(lons[0])):
        return None
    return float(lats[0]), float(lons[0])


def temporal_coords(dates: Sequence[dt.datetime]) -> torch.Tensor:
    """[T, 2] float32: (year, day of year) per frame, the day 1-based (1 January is 1)."""
    return torch.tensor([[when.year, when.timetuple().tm_yday] for when in dates], dtype=torch.float32)


def model_coords(encodings: Sequence[str], acquired, centre: Optional[Tuple[float, float]],
                 name: str) -> Optional[GeoCoords]:
    """A scene's coordinates for a model with `encodings` (`model.prithvi.coords_encoding`); None for a model
    without any. `acquired`: an Acquired (or None), or one per date of a multi-date scene (temporal_coords
    [T, 2], frame t from date t). A missing date (any date's) or CRS leaves that encoding out, as the
    reference does, and says so once."""
    if not encodings:
        return None
    dates = tuple(acquired) if isinstance(acquired, (tuple, list)) else (acquired,)
    temporal = location = None
    if "time" in encodings:
        missing = [str(i) for i, a in enumerate(dates, 1) if a is None]
        if not missing:
            temporal = temporal_coords([a.when for a in dates])
        else:
            which = "" if len(dates) == 1 else f" for date {', '.join(missing)} of {len(dates)}"
            hint = "date=YYYY-MM-DD" if len(dates) == 1 else f"date=[{','.join(['YYYY-MM-DD'] * len(dates))}]"
            log.warning("%s: no acquisition date%s (no STAC datetime, date tag or dated file name): the model runs "
                        "without its time encoding; give one with %s", name, which, hint)
    if "location" in encodings:
        if centre is not None:
            location = torch.tensor(centre, dtype=torch.float32)
        else:
            log.warning("%s: no CRS, so no location: the model runs without its location encoding", name)
    return GeoCoords(temporal, location)


def model_encodings(cfg) -> Tuple[str, ...]:
    """The coordinate encodings the configured model declares (`model.prithvi.coords_encoding`)."""
    model = cfg.get("model") if cfg is not None else None
    prithvi = model.get("prithvi") if model is not None else None
    return tuple(prithvi.get("coords_encoding") or ()) if prithvi is not None else ()


def coords_tags(scene) -> Dict[str, str]:
    """The mask's tags saying when and where the scene was taken and what the model was given."""
    tags: Dict[str, str] = {}
    if scene.acquired is not None:
        tags.update(acquisition_date=scene.acquired.date, acquisition_date_source=scene.acquired.source)
    if len(scene.acquisitions) > 1:  # a multi-date scene: every date, in order (acquisition_date is date 1's)
        tags["acquisition_dates"] = ",".join(a.date if a is not None else "none" for a in scene.acquisitions)
    coords = scene.coords
    if coords is not None:
        time = coords.temporal
        tags["model_time_coords"] = ("none (no acquisition date)" if time is None else
                                     ";".join(f"{int(y)},{int(d)}" for y, d in time.tolist()))
        tags["model_location_coords"] = ("none (no CRS)" if coords.location is None else
                                         "{:.6f},{:.6f}".format(*scene.centre))  # the model gets them as float32
    return tags


def coords_properties(scene) -> Dict[str, Any]:
    """The STAC item's record of a multi-date scene's dates (`start_datetime` / `end_datetime` when all are
    known, `appliance:acquisition_dates`) and of the coordinates the model was given (TL models only)."""
    props: Dict[str, Any] = {}
    dates = scene.acquisitions
    if len(dates) > 1:
        props["appliance:acquisition_dates"] = [a.date if a is not None else None for a in dates]
        if all(a is not None for a in dates):
            props.update(start_datetime=min(a.when for a in dates).isoformat(),
                         end_datetime=max(a.when for a in dates).isoformat())
    coords = scene.coords
    if coords is None:
        return props
    return {**props, "appliance:model_coords": {
        "time": None if coords.temporal is None else [[int(v) for v in frame] for frame in coords.temporal.tolist()],
        "location": None if coords.location is None else [round(v, 6) for v in scene.centre],
    }}
