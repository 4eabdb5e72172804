"""The pages' files, each answered with headers that let it run nothing but its own files.

The route table (http/route_table.py) says where they are served: the kind's page at `/` (and
`/index.html`), the docs page at `/docs` (and `/docs.html`, `/redoc`), their scripts and styles at
`/ui/<name>`. Both pages sit at the root, so the same relative asset URLs (`ui/chat.js`) work from every
path of a page and behind a proxy that mounts the server under a prefix.

Such a proxy (an Ingress with a rewrite) sends both `/prefix` and `/prefix/` to our `/`, and from the
first the browser resolves the page's relative URLs outside the prefix. The server cannot tell the two
apart, so where the proxy names its prefix (`X-Forwarded-Prefix`: ingress-nginx's `x-forwarded-prefix`
annotation, Traefik's StripPrefix) `/` answers a redirect to the page's own path under it, from which
they resolve.
"""
import re
from pathlib import Path
from typing import Optional

from starlette.requests import Request
from starlette.responses import Response

from appliance.serving.online_stages import ServedKind
from appliance.serving.http.route_table import INDEX

STATIC = Path(__file__).with_name("static")
# The page for each kind of pipeline: a chat for generate, a map for pool (GeoTIFF scenes through
# /v1/scenes: water, burn scars, crops); plain pipelines get a short page that says they have none and
# points to the API docs.
PAGES = {ServedKind.generate: "chat.html", ServedKind.pool: "map.html", ServedKind.plain: "no_page.html"}
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8"}
# Our modules and stylesheet, and beside them in vendor/ the libraries the page runs (with their licenses).
ASSETS = tuple(sorted(f"/ui/{path.relative_to(STATIC).as_posix()}" for path in STATIC.rglob("*")
                      if path.suffix in (".js", ".css")))
# A prefix is plain path segments: anything else (`//host`, a scheme) would send the browser elsewhere.
PREFIX = re.compile(r"(?:/[A-Za-z0-9._~-]+)+")
# Only this origin's files run or load; thumbnails of attached images are data: and blob: URLs.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY",
           "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}


class StaticFile:
    """One file of `static/`, read once, answered with the security headers."""

    def __init__(self, name: str):
        path = STATIC / name
        self.body = path.read_bytes()
        self.media_type = TYPES[path.suffix]

    def response(self) -> Response:
        return Response(self.body, media_type=self.media_type, headers=HEADERS)


class PageFiles:
    """The handlers of the page routes of a pipeline's kind; each returns None for a file it has not."""

    def __init__(self, kind: ServedKind):
        self.page = StaticFile(PAGES[kind])
        self.docs_page = StaticFile("docs.html")
        self.assets = {path.removeprefix("/ui/"): StaticFile(path.removeprefix("/ui/")) for path in ASSETS}

    async def index(self, request: Request) -> Response:
        return self.page.response()

    async def docs(self, request: Request) -> Response:
        return self.docs_page.response()

    async def asset(self, request: Request) -> Optional[Response]:
        file = self.assets.get(request.path_params["file"])
        return None if file is None else file.response()


def prefix_redirect(scope: dict, page_served: bool) -> Optional[str]:
    """`<prefix>/index.html` for `/` asked through a proxy that names its prefix, where the page is served;
    else None (a prefix that is not plain path segments is ignored)."""
    if scope["path"] != "/" or not page_served:
        return None
    prefix = dict(scope["headers"]).get(b"x-forwarded-prefix", b"").decode("latin-1").rstrip("/")
    return f"{prefix}{INDEX}" if PREFIX.fullmatch(prefix) else None
