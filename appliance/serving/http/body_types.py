"""A route takes the body types the route table declares for it; a JSON route answers 415 to any other.

Why it matters: a browser sends a `text/plain`, `application/x-www-form-urlencoded` or
`multipart/form-data` body (or one with no type) to another origin without asking that origin first (no
CORS preflight), so if a JSON route read such a body, any page a person opens could drive a server on
their machine or network that runs without a key. `application/json` goes cross-site only after a
preflight, which the server refuses unless `server.cors_origins` lists the page's origin (cors.py). The
GeoTIFF routes check their own types (routes_pool.py, routes_scenes.py), their messages saying how a
multi-date model's dates are sent.
"""
from functools import partial
from typing import Awaitable, Callable

from starlette.requests import Request

from appliance.serving.http.errors import APIError
from appliance.serving.http.route_table import JSON, Route


def content_type(request: Request) -> str:
    """The body's media type, lower case, without parameters ('' when missing)."""
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def json_only(route: Route, handler: Callable[[Request], Awaitable]) -> Callable[[Request], Awaitable]:
    """`handler`, after a 415 for a body that is not `application/json` (a partial: LitServe pickles the
    spec's endpoints for its inference worker)."""
    return partial(_checked, f"{' '.join(route.methods)} {route.path}", handler)


async def _checked(where: str, handler: Callable[[Request], Awaitable], request: Request):
    kind = content_type(request)
    if kind != JSON:
        raise APIError(415, f"Content-Type: {kind or 'missing'}; {where} takes {JSON}", param="Content-Type")
    return await handler(request)
