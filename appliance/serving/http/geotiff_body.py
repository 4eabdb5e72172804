"""What `/v1/pool` and `/v1/scenes` share of a request whose body is the GeoTIFF itself: their query
parameters checked by name, the body's content type, the body spooled to a file as it streams in, and
the `?date=` it may carry."""
import asyncio
from typing import Optional, Sequence

from starlette.requests import Request

from appliance.errors import InputError
from appliance.serving.http.errors import APIError
from appliance.stages.geo.acquisition import parse_date


def refuse_unknown_query(request: Request, allowed: Sequence[str]) -> None:
    """A typo (`quicklok`) must not silently give the default, as unknown JSON fields are refused."""
    unknown = sorted(set(request.query_params) - set(allowed))
    if unknown:
        raise APIError(400, f"{unknown[0]}: unknown query parameter; allowed: {', '.join(allowed)}",
                       param=unknown[0])


def content_type(request: Request) -> str:
    """The body's media type, lower case, without parameters ('' when missing)."""
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def checked_date(value: Optional[str], field: str) -> Optional[str]:
    """The acquisition date as a job takes it (None: the source's own), checked as the CLI's `date=`."""
    try:
        parse_date(value, field)
    except InputError as e:
        raise APIError.from_input(e) from None
    return value or None


async def spool_body(request: Request, path: str) -> None:
    """The body to `path` as it streams in (the Gate enforces the body limit); 400 when it is empty."""
    size = 0
    with open(path, "wb") as f:
        async for chunk in request.stream():
            size += len(chunk)
            await asyncio.to_thread(f.write, chunk)
    if size == 0:
        raise APIError(400, "body: empty; send the GeoTIFF as the request body", param="body")
