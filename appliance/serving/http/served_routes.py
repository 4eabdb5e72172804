"""The routes one server serves (route_table.py's `served`), found by a request's path as Starlette finds
them: which need the key, which methods a path has, which routes there are."""
from typing import Iterable, List

from starlette.routing import compile_path

from appliance.serving.http.route_table import Route


class ServedRoutes:
    def __init__(self, routes: Iterable[Route]):
        self.routes = list(routes)
        self.patterns = [(compile_path(route.path)[0], route) for route in self.routes]
        self.paths = frozenset(route.path for route in self.routes)

    def at(self, path: str) -> List[Route]:
        """The routes whose path matches `path`, every method's."""
        return [route for pattern, route in self.patterns if pattern.match(path)]

    def methods(self, path: str) -> List[str]:
        """Every method of `path` (a 405's `Allow`); none for a path no route has."""
        return sorted({method for route in self.at(path) for method in route.methods})

    def is_open(self, path: str) -> bool:
        """True when `path` is answered without the API key: it is served, and no route of it needs the key."""
        routes = self.at(path)
        return bool(routes) and not any(route.auth for route in routes)

    def no_such_route(self, path: str) -> str:
        """A 404's message, naming the API routes this server answers (not the pages' files)."""
        api = sorted({route.path for route in self.routes if route.documented})
        return f"{path}: no such route; this server answers {', '.join(api)}"
