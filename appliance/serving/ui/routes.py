"""The page's files as routes, each answered with headers that let it run nothing but its own files.

LitServe registers its own `GET /` and FastAPI its CDN-loading `GET /docs` before our spec's routes, and
Starlette answers with the first route that matches; so our pages live at `/index.html` and `/docs.html`,
and the Gate (http/middleware.py) sends `/`, `/docs` and `/redoc` to them (`ALIASES`) when they are
served. Both pages sit at the root, so the same relative asset URLs (`ui/chat.js`) work from the alias
and from the page's own path, and behind a proxy that mounts the server under a prefix.

Such a proxy (an Ingress with a rewrite) sends both `/prefix` and `/prefix/` to our `/`, and from the
first the browser resolves the page's relative URLs outside the prefix. The server cannot tell the two
apart, so where the proxy names its prefix (`X-Forwarded-Prefix`: ingress-nginx's `x-forwarded-prefix`
annotation, Traefik's StripPrefix) `/` answers a redirect to the page's own path under it, from which
they resolve.
"""
import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from starlette.requests import Request
from starlette.responses import Response

STATIC = Path(__file__).with_name("static")
INDEX, DOCS = "/index.html", "/docs.html"
# The page for each kind of pipeline: a chat for generate, a map for pool (GeoTIFF scenes through
# /v1/scenes: water, burn scars, crops); plain pipelines get a short page that says they have none and
# points to the API docs.
PAGES = {"generate": "chat.html", "pool": "map.html", "plain": "no_page.html"}
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8"}
ASSETS = tuple(sorted(f"/ui/{path.name}" for path in STATIC.iterdir() if path.suffix in (".js", ".css")))
PAGE_PATHS = (INDEX, DOCS, *ASSETS)  # open without the API key: they hold nothing of the server's
ALIASES = {"/": INDEX, "/docs": DOCS, "/redoc": DOCS}
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

    async def answer(self, request: Request) -> Response:
        return Response(self.body, media_type=self.media_type, headers=HEADERS)


def page_routes(kind: str, ui: bool) -> List[Tuple[str, StaticFile]]:
    """(path, file) of every page route: the docs page always; with `ui`, the kind's page at INDEX."""
    files: Dict[str, str] = {DOCS: "docs.html", **{path: path.removeprefix("/ui/") for path in ASSETS}}
    if ui:
        files[INDEX] = PAGES[kind]
    return [(path, StaticFile(name)) for path, name in files.items()]


def aliased(scope: dict, routes) -> dict:
    """The request's scope, its path one of our pages' if it names one by its alias and that page is served."""
    target = ALIASES.get(scope["path"])
    return {**scope, "path": target} if target in routes else scope


def prefix_redirect(scope: dict, routes) -> Optional[str]:
    """`<prefix>/index.html` for `/` asked through a proxy that names its prefix, where the page is served;
    else None (a prefix that is not plain path segments is ignored)."""
    if scope["path"] != "/" or INDEX not in routes:
        return None
    prefix = dict(scope["headers"]).get(b"x-forwarded-prefix", b"").decode("latin-1").rstrip("/")
    return f"{prefix}{INDEX}" if PREFIX.fullmatch(prefix) else None
