"""The HTTP process's front door, a plain ASGI middleware (LitServer(middlewares=[(Gate, ...)]), server.py).

For every request it checks the API key and the body limit, counts the answer by route and status, and
(with `server.access_log`, on by default) writes the request's log line once the answer ended
(access_log.py). Which routes need the key is the route table's word (route_table.py, `auth`). `/` asked
through a proxy that names its path prefix is sent to the page's path under it (appliance/serving/ui/
routes.py, `prefix_redirect`); LitServe's own routes (its `GET /` where we serve no page there, its health
and info) get the 404 of an unknown route.
A plain ASGI class, not Starlette's BaseHTTPMiddleware, which buffers streams and hides client
disconnects from the routes.
"""
import hmac
import json
import time
from typing import Callable, Iterable, Optional

from appliance.protocol.openai_responses import error_body
from appliance.serving.http.access_log import AccessLog
from appliance.serving.http.errors import LITSERVE_ROUTES, APIError
from appliance.serving.http.served_routes import ServedRoutes
from appliance.serving.ui.routes import INDEX, prefix_redirect


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
    def __init__(self, app, routes: ServedRoutes, metrics: Callable, max_bytes: int,
                 api_key: Optional[str] = None, access_log: bool = True):
        """`routes`: the server's routes (counted by path; any other path counts as "other"); `metrics`:
        returns the process's HttpMetrics (made on first use, in the HTTP process); `api_key`: required
        on every route but the open ones (probes, metrics, docs, pages); `access_log`: one line per request."""
        self.app = app
        self.routes = routes
        self.metrics = metrics
        self.max_bytes = max_bytes
        self.key = api_key.encode() if api_key else None
        self.access = AccessLog() if access_log else None  # off: not even the clock is read

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        redirect = prefix_redirect(scope, INDEX in self.routes.paths)
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
            route = scope["path"] if scope["path"] in self.routes.paths else "other"
            self.metrics().request(route, status)
            if self.access is not None:
                self.access.write(scope, status, began)

    async def _admit(self, scope, send) -> bool:
        """LitServe's routes, the API key and the declared body size; False once a refusal was sent."""
        path = scope["path"]
        if path in LITSERVE_ROUTES and path not in self.routes.paths:
            await send_error(send, 404, self.routes.no_such_route(path))
            return False
        headers = dict(scope["headers"])
        if self.key is not None and not self.routes.is_open(path):
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
