"""Cross-origin requests: refused unless `server.cors_origins` lists the page's origin.

Without it the server sends no `Access-Control-Allow-Origin`, so a browser lets no page of another origin
read an answer nor send a JSON body (a JSON `Content-Type` needs a preflight, which gets no allowing
answer); the bodies a browser sends without a preflight are refused by type (body_types.py). With it,
Starlette's CORSMiddleware answers preflights and marks answers for those origins only; it runs outside
the Gate, so a preflight (which carries no key) is answered and every answer, a refusal too, is marked.
"""
from typing import List, Sequence

from starlette.middleware.cors import CORSMiddleware

from appliance.serving.http.served_routes import ServedRoutes

HEADERS = ["Authorization", "Content-Type", "X-API-Key"]  # what clients send: the key, the body's type
EXPOSED = ["Location", "Retry-After"]  # what a page may read of an answer beside the simple headers


def cors_middleware(origins: Sequence[str], routes: ServedRoutes) -> List[tuple]:
    """`[(CORSMiddleware, its settings)]` for LitServer(middlewares=...) when `origins` are listed, else []."""
    if not origins:
        return []
    methods = sorted({method for route in routes.routes for method in route.methods})
    return [(CORSMiddleware, {"allow_origins": list(origins), "allow_methods": methods, "allow_headers": HEADERS,
                              "expose_headers": EXPOSED})]
