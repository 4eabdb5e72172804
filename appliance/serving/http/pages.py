"""The pages' routes (route_table.py's `page` routes), answered ahead of the app, a plain ASGI middleware
(LitServer(middlewares=[(Pages, ...)]), server.py): LitServe adds its own `GET /` before our routes, and
Starlette answers with the first route that matches, so our `/` would never be reached as an app route.
A path no page file has (`/ui/nope.js`) and a method no page takes go on to the app: its 404, its 405.
"""
from typing import Callable, Iterable, Tuple

from starlette.requests import Request
from starlette.routing import compile_path

from appliance.serving.http.route_table import Route


class Pages:
    def __init__(self, app, routes: Iterable[Tuple[Route, Callable]]):
        """`routes`: each page route with its handler (a coroutine of the request: a response, or None)."""
        self.app = app
        self.pages = [(compile_path(route.path)[0], route.methods, handler) for route, handler in routes]

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            for pattern, methods, handler in self.pages:
                match = pattern.match(scope["path"])
                if match and scope["method"] in methods:
                    response = await handler(Request({**scope, "path_params": match.groupdict()}, receive))
                    if response is not None:
                        return await response(scope, receive, send)
        await self.app(scope, receive, send)
