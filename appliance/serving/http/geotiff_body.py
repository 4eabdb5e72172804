"""What `/v1/pool` and `/v1/scenes` share of a request whose body is the GeoTIFF itself: their query
parameters checked by name, a body of the wrong type refused, the body spooled to a file as it streams in, and
the `?date=` it may carry (a multi-date model's T dates: `?date=d1&date=d2&date=d3` or `?date=d1,d2,d3`).

A raw body is one file: for a multi-date model, one stacked GeoTIFF of its T dates (`model.geo.
stacked_band_order`); a list of dates goes as JSON (`/pooling`'s `data.data`, `/v1/scenes`' `urls`) or as
a form of files to `/v1/scenes` (form_body.py)."""
import asyncio
from typing import Any, Optional, Sequence

from starlette.requests import Request

from appliance.errors import InputError
from appliance.serving.http.errors import APIError
from appliance.stages.geo.multidate import given_dates


def refuse_unknown_query(request: Request, allowed: Sequence[str]) -> None:
    """A typo (`quicklok`) must not silently give the default, as unknown JSON fields are refused."""
    unknown = sorted(set(request.query_params) - set(allowed))
    if unknown:
        raise APIError(400, f"{unknown[0]}: unknown query parameter; allowed: {', '.join(allowed)}",
                       param=unknown[0])


def query_dates(request: Request) -> Any:
    """`?date=` as sent: None, one date, or a list (repeated, or comma-separated: dates hold no commas)."""
    values = [part.strip() for value in request.query_params.getlist("date") for part in value.split(",")]
    return None if not values else values[0] if len(values) == 1 else values


def checked_dates(value: Any, frames: int, field: str) -> Any:
    """The acquisition date(s) as a job takes them (None: the source's own), checked as the CLI's `date=`
    for a model of `frames` dates (multidate.given_dates): a 400 naming `field`."""
    try:
        given_dates(value, frames, field)
    except InputError as e:
        raise APIError.from_input(e) from None
    return value or None


def unsupported_body(kind: str, frames: int, json_form: Optional[str] = None) -> APIError:
    """415 for a body that is no GeoTIFF; a multi-date model's says how its dates are sent."""
    what = "the GeoTIFF" if frames == 1 else f"one stacked GeoTIFF of the model's {frames} dates"
    also = f", or {json_form} as application/json" if json_form else ""
    dates = "" if frames == 1 else (f"; {frames} separate dates go as a JSON list (/pooling's data.data, /v1/scenes' "
                                    "urls) or as a multipart/form-data form of files to /v1/scenes")
    return APIError(415, f"Content-Type: {kind or 'missing'}; send {what} as the body with Content-Type: "
                         f"image/tiff{also}{dates}")


async def spool_body(request: Request, path: str) -> None:
    """The body to `path` as it streams in (the Gate enforces the body limit); 400 when it is empty."""
    size = 0
    with open(path, "wb") as f:
        async for chunk in request.stream():
            size += len(chunk)
            await asyncio.to_thread(f.write, chunk)
    if size == 0:
        raise APIError(400, "body: empty; send the GeoTIFF as the request body", param="body")
