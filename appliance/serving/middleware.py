"""ASGI middleware of the HTTP process: the API key, the body limit, and HTTP metrics.

Plain ASGI classes (not Starlette's BaseHTTPMiddleware, which buffers streams and hides client
disconnects from the routes).
"""
import hmac
import json
from typing import Iterable, Optional

from appliance.protocol.openai_responses import error_body
from appliance.serving.errors import APIError

OPEN_PATHS = ("/health", "/ready", "/version", "/metrics", "/docs", "/openapi.json")


async def send_error(send, status: int, message: str, headers: Iterable = ()) -> None:
    body = json.dumps(error_body(status, message)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


class APIKeyMiddleware:
    """`Authorization: Bearer KEY` (what OpenAI clients send) or `X-API-Key: KEY` on every route but
    the open ones (probes, metrics, docs); compared in constant time."""

    def __init__(self, app, api_key: str):
        self.app = app
        self.key = api_key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        given = headers.get(b"x-api-key") or b""
        auth = headers.get(b"authorization", b"")
        if auth[:7].lower() == b"bearer ":
            given = auth[7:].strip()
        if not hmac.compare_digest(given, self.key):
            return await send_error(send, 401, "missing or wrong API key; send Authorization: Bearer <key>",
                                    [(b"www-authenticate", b"Bearer")])
        return await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """413 for a body over `max_bytes`: at once from Content-Length, else while it streams in."""

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await send_error(send, 413, self._message(int(length)))
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise APIError(413, self._message(None))
            return message

        return await self.app(scope, limited, send)

    def _message(self, size: Optional[int]) -> str:
        size_text = f"{size} bytes" if size is not None else "larger"
        return (f"body: the request is {size_text}; the limit is {self.max_bytes} bytes "
                "(server.limits.max_request_bytes)")


class MetricsMiddleware:
    """Counts requests by route and status (unknown paths count as one route, so the series stay few)."""

    def __init__(self, app, metrics, routes: Iterable[str]):
        self.app = app
        self.metrics = metrics
        self.routes = set(routes)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        route = scope["path"] if scope["path"] in self.routes else "other"
        status = 500

        async def counted(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counted)
        finally:
            self.metrics().request(route, status)
