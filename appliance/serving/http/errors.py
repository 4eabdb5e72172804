"""HTTP errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, for every route."""
import json
from typing import Dict, Optional

from starlette.requests import Request
from starlette.responses import JSONResponse

from appliance.errors import InputError
from appliance.protocol.openai_responses import error_body
from appliance.serving.http.served_routes import ServedRoutes


class APIError(Exception):
    def __init__(self, status: int, message: str, param: Optional[str] = None,
                 headers: Optional[Dict[str, str]] = None):
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers

    @classmethod
    def from_input(cls, error: InputError) -> "APIError":
        return cls(error.status, str(error), error.param)


def error_response(status: int, message: str, param: Optional[str] = None,
                   headers: Optional[Dict[str, str]] = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status, headers=headers)


async def api_error_handler(request: Request, error: APIError) -> JSONResponse:
    return error_response(error.status, error.message, error.param, error.headers)


# LitServe always adds `GET /` and a health and an info route (server.py moves those two aside, since
# ours answers /health); no client of ours uses them, so the Gate answers them as unknown routes (our
# page at `/` is answered before them: pages.py).
LITSERVE_HEALTH, LITSERVE_INFO = "/litserve/health", "/litserve/info"
LITSERVE_ROUTES = ("/", LITSERVE_HEALTH, LITSERVE_INFO)


class RouteErrors:
    """FastAPI's and Starlette's own errors (404 route, 405 method) in our shape, read against the routes
    this server serves: a 405's `Allow` lists every method of its path (Starlette names only those of the
    first route that matches, and each method of ours is its own route), and a path that only our page
    layer serves answers 405 to a method it does not take, not 404."""

    def __init__(self, served: ServedRoutes):
        self.served = served

    async def http_exception(self, request: Request, error) -> JSONResponse:
        detail = getattr(error, "detail", None) or str(error)
        status = getattr(error, "status_code", 500)
        headers = getattr(error, "headers", None)
        path = request.url.path
        methods = self.served.methods(path) if status in (404, 405) else []
        if methods and request.method not in methods:
            status, detail = 405, f"{request.method} {path}: method not allowed; allowed: {', '.join(methods)}"
            headers = {**(headers or {}), "Allow": ", ".join(methods)}
        elif status == 404:
            detail = self.served.no_such_route(path)
        return error_response(status, str(detail), headers=headers)


async def parse_body(request: Request, parse):
    """The body read as JSON and given to `parse` (appliance/protocol); its InputError as a 400 naming the field."""
    body = await read_json(request)
    try:
        return parse(body)
    except InputError as e:
        raise APIError.from_input(e) from None


async def read_json(request: Request) -> object:
    """The body as JSON, read from the stream (Starlette's `request.body()` keeps the bytes on the request
    for its whole life; a request waiting in the queue should not hold its upload twice)."""
    chunks = [chunk async for chunk in request.stream()]
    return parse_json(b"".join(chunks))


def _refuse_constant(constant: str):
    raise ValueError(f"{constant} is not a JSON number")


# What `json.loads(body, parse_constant=...)` builds per call, made once (it holds no state).
DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def parse_json(body: bytes) -> object:
    """A request body as JSON (UTF-8, -16 or -32, as `json.loads` reads bytes); NaN and Infinity are
    refused (they are not JSON)."""
    try:
        return DECODER.decode(body.decode(json.detect_encoding(body), "surrogatepass"))
    except UnicodeDecodeError:
        raise APIError(400, "body: not UTF-8 text; send a JSON object") from None
    except ValueError as e:
        raise APIError(400, f"body: not valid JSON ({e}); send a JSON object") from None
