"""The HTTP process's front door, a plain ASGI middleware (LitServer(middlewares=[(Gate, ...)]), server.py).

For every request it checks the API key and the body limit, counts the answer by route and status, and
(with `server.access_log`, on by default) writes the request's log line once the answer ended
(access_log.py). `/` asked through a proxy that names its path prefix is sent to the page's path under
it (appliance/serving/ui/routes.py, `prefix_redirect`); LitServe's own routes (`GET /`, its health and
info) get the 404 of an unknown route.
A plain ASGI class, not Starlette's BaseHTTPMiddleware, which buffers streams and hides client
disconnects from the routes.
"""
import hmac
import json
import time
from typing import Callable, Iterable, Optional

from appliance.protocol.openai_responses import error_body
from starlette.requests import Request

from appliance.serving.http.access_log import AccessLog
from appliance.serving.http.errors import LITSERVE_ROUTES, APIError, no_such_route
from appliance.serving.ui.routes import PAGE_PATHS, aliased, prefix_redirect

OPEN_PATHS = ("/health", "/ready", "/version", "/metrics", "/docs", "/openapi.json", *PAGE_PATHS)


async def send_error(send, status: int, message: str, headers: Iterable = ()) -> None:
    body = json.dumps(error_body(status, message)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


async def send_redirect(send, location: str) -> None:
    await send({"type": "http.response.start", "status": 307,
                "headers": [(b"location", location.encode()), (b"content-length", b"0"),
                            (b"cache-control", b"no-cache")]})
    await send({"type": "http.response.body", "body": b""})


class Gate:
    def __init__(self, app, routes: Iterable[str], metrics: Callable, max_bytes: int,
                 api_key: Optional[str] = None, access_log: bool = True):
        """`routes`: our routes' paths (counted by path; any other path counts as "other"); `metrics`:
        returns the process's HttpMetrics (made on first use, in the HTTP process); `api_key`: required
        on every route but the open ones (probes, metrics, docs); `access_log`: one line per request."""
        self.app = app
        self.routes = frozenset(routes)
        self.metrics = metrics
        self.max_bytes = max_bytes
        self.key = api_key.encode() if api_key else None
        self.access = AccessLog() if access_log else None  # off: not even the clock is read

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        asked = scope["path"]
        redirect = prefix_redirect(scope, self.routes)
        scope = aliased(scope, self.routes)  # `/` and `/docs`: our pages (appliance/serving/ui/routes.py)
        began = time.perf_counter() if self.access is not None else 0.0
        status = None  # the answer's, once it started

        async def counted(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            if redirect is not None:
                await send_redirect(counted, redirect)
            elif await self._admit(scope, counted):
                await self.app(scope, self._limited(receive), counted)
        finally:
            status = 500 if status is None else status
            route = scope["path"] if scope["path"] in self.routes else "other"
            self.metrics().request(route, status)
            if self.access is not None:
                self.access.write(scope if scope["path"] == asked else {**scope, "path": asked}, status, began)

    async def _admit(self, scope, send) -> bool:
        """LitServe's routes, the API key and the declared body size; False once a refusal was sent."""
        if scope["path"] in LITSERVE_ROUTES:
            await send_error(send, 404, no_such_route(Request(scope)))
            return False
        headers = dict(scope["headers"])
        if self.key is not None and scope["path"] not in OPEN_PATHS:
            given = headers.get(b"x-api-key") or b""
            auth = headers.get(b"authorization", b"")
            if auth[:7].lower() == b"bearer ":
                given = auth[7:].strip()
            if not hmac.compare_digest(given, self.key):
                await send_error(send, 401, "missing or wrong API key; send Authorization: Bearer <key>",
                                 [(b"www-authenticate", b"Bearer")])
                return False
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await send_error(send, 413, self._too_large(int(length)))
            return False
        return True

    def _limited(self, receive):
        """`receive` that raises 413 once the body streamed in passes the limit (no Content-Length)."""
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise APIError(413, self._too_large(None))
            return message

        return limited

    def _too_large(self, size: Optional[int]) -> str:
        size_text = f"{size} bytes" if size is not None else "larger"
        return (f"body: the request is {size_text}; the limit is {self.max_bytes} bytes "
                "(server.limits.max_request_bytes)")
