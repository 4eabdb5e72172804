"""`search.*`: a run's scenes from a STAC API search (pystac-client), instead of `input=`.

`check_search` validates the keys (one InputError naming the key); `run_search` asks the API, page by page
(`search.page_size` items a page, at most `search.max_items` in all), and returns the items found as dicts,
each with its self link. The cloud-cover limit goes to the API as a CQL2 `filter` when its conformance
lists the Filter extension, else as the Query extension's `query`. The area is `search.bbox`, else the
run's `aoi` (carried into lon/lat). How items become scenes is search_plan.py's.
"""
import math
from typing import Any, List, Optional, Sequence

from appliance.errors import InputError
from appliance.stages.geo.acquisition import parse_date
from appliance.stages.geo.scene_sources import scheme, shown

API_RETRIES = 3
CLOUD_COVER = "eo:cloud_cover"


def check_search(search: Any, aoi=None) -> dict:
    """The search's keys as pystac-client takes them (bbox and datetime checked), or InputError naming the key."""
    url = search.get("url")
    if scheme(str(url)) not in ("http", "https"):
        raise InputError(f"search.url: expected the STAC API's http(s) URL, got {url!r}", param="search.url")
    bbox = check_bbox(search.get("bbox")) if search.get("bbox") is not None else aoi_bbox(aoi)
    cloud = search.get("max_cloud_cover")
    if cloud is not None and not 0 <= float(cloud) <= 100:
        raise InputError(f"search.max_cloud_cover: {cloud} is not a percentage (0..100)",
                         param="search.max_cloud_cover")
    for key in ("max_items", "page_size"):
        if int(search.get(key)) < 1:
            raise InputError(f"search.{key}: must be at least 1, got {search.get(key)}", param=f"search.{key}")
    return {"collections": list(search.get("collections") or []) or None, "bbox": bbox,
            "datetime": check_datetime(search.get("datetime")), "max_items": int(search.get("max_items")),
            "limit": int(search.get("page_size"))}


def check_bbox(value: Any) -> List[float]:
    try:
        box = [float(v) for v in value]
    except (TypeError, ValueError):
        box = []
    if len(box) != 4 or not all(math.isfinite(v) for v in box):
        raise InputError(f"search.bbox: expected [west, south, east, north], four numbers in lon/lat, got {value!r}",
                         param="search.bbox")
    west, south, east, north = box
    if not (-180 <= west < east <= 180 and -90 <= south < north <= 90):
        raise InputError(f"search.bbox: {box} is not [west, south, east, north] in lon/lat (west < east within "
                         "-180..180, south < north within -90..90)", param="search.bbox")
    return box


def aoi_bbox(aoi) -> Optional[List[float]]:
    """The run's area of interest (aoi.Aoi) as a lon/lat box, or None."""
    if aoi is None:
        return None
    from rasterio.warp import transform_bounds

    return list(transform_bounds(aoi.crs, "EPSG:4326", *aoi.bounds, densify_pts=21))


def check_datetime(value: Any) -> Optional[str]:
    """`START/END` (either `..` for open) or one date / time; InputError naming search.datetime."""
    if value is None or str(value) == "":
        return None
    text = str(value)
    ends = text.split("/")
    if len(ends) > 2 or ends == ["..", ".."]:
        raise InputError(f"search.datetime: expected START/END or one date, got {text!r}", param="search.datetime")
    times = [None if end in ("", "..") else parse_date(end, "search.datetime") for end in ends]
    start, end = times if len(times) == 2 else (None, None)
    if start is not None and end is not None and start > end:
        raise InputError(f"search.datetime: {text} ends before it starts", param="search.datetime")
    return text


def run_search(search: Any, aoi=None, cloud_filter: bool = True) -> List[dict]:
    """The items the API finds (dicts with self links), in the API's order. `cloud_filter=False` leaves
    the cloud-cover limit out (`appliance check`: to say which items it excluded)."""
    from pystac_client import Client
    from pystac_client.conformance import ConformanceClasses
    from pystac_client.exceptions import APIError
    from pystac_client.stac_api_io import StacApiIO
    from requests import RequestException

    params = check_search(search, aoi)
    url = str(search.get("url"))
    try:
        stac_io = StacApiIO(timeout=float(search.get("api_timeout_s")), max_retries=api_retries())
        client = Client.open(url, stac_io=stac_io)
        cloud = search.get("max_cloud_cover")
        if cloud is not None and cloud_filter:
            params.update(cloud_params(float(cloud), client.conforms_to(ConformanceClasses.FILTER),
                                       client.conforms_to(ConformanceClasses.QUERY)))
        items = [item.to_dict() for item in client.search(**params).items()]
    except (APIError, RequestException, OSError) as e:
        raise InputError(f"search.url: the STAC API at {shown(url)} could not be searched ({reason(e)})",
                         param="search.url") from None
    return items


def api_retries():
    """A busy API's answers (429, 502-504) are asked again, with backoff; a refused connection is not."""
    from urllib3.util.retry import Retry

    return Retry(total=API_RETRIES, connect=0, backoff_factor=0.5, status_forcelist=(429, 502, 503, 504),
                 allowed_methods=None)


def reason(error: BaseException) -> str:
    """The innermost cause's first line (requests wraps a refused connection three deep)."""
    while error.__context__ is not None and str(error.__context__):
        error = error.__context__
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def cloud_params(limit: float, has_filter: bool, has_query: bool) -> dict:
    """The cloud-cover limit in the form the API offers (CQL2 first)."""
    if has_filter:
        return {"filter": {"op": "<=", "args": [{"property": CLOUD_COVER}, limit]}, "filter_lang": "cql2-json"}
    if has_query:
        return {"query": {CLOUD_COVER: {"lte": limit}}}
    raise InputError("search.max_cloud_cover: the STAC API offers neither the Filter nor the Query extension, so it "
                     "cannot filter by cloud cover; leave max_cloud_cover unset", param="search.max_cloud_cover")


def describe(search: Any, params_bbox: Optional[Sequence[float]]) -> str:
    """How messages name a search: its collections, box and dates."""
    parts = [f"collections {','.join(search.get('collections') or []) or '(all)'}"]
    if params_bbox:
        parts.append("bbox [" + ", ".join(f"{v:g}" for v in params_bbox) + "]")
    if search.get("datetime"):
        parts.append(f"datetime {search.get('datetime')}")
    if search.get("max_cloud_cover") is not None:
        parts.append(f"cloud cover <= {search.get('max_cloud_cover')}%")
    return ", ".join(parts)
