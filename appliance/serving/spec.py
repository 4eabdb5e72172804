"""The routes of `appliance serve`, as a LitSpec on LitServe's FastAPI app.

The pipeline's kind decides the API: a generating engine gets OpenAI's `/v1/chat/completions`,
`/v1/completions` and `/v1/models`; a pooling engine gets vLLM's `/pooling` and the raw `/v1/pool`;
a pipeline without an engine gets LitServe's generic `POST /predict`. Every server has `/health`,
`/ready`, `/version` and `/metrics`.

LitServe adds these as FastAPI routes; `serve_plain` then swaps each for a Starlette route. Our handlers
read their own bodies and answer Starlette responses, so FastAPI's per-request work (solving LitServe's
auth dependency, two exit stacks, more cyclic garbage) bought nothing, and it was ~15 % of the HTTP
process's CPU at 64 streams (docs/benchmarks.md, run N). FastAPI's routes still describe them in
`/openapi.json`.
"""
from typing import Dict, List, Tuple

from fastapi.routing import APIRoute
from litserve.specs.base import LitSpec
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.routing import Route

from appliance.serving.errors import APIError, api_error_handler, http_exception_handler
from appliance.serving.frontend import Frontend
from appliance.serving.routes_generate import GenerateRoutes
from appliance.serving.routes_ops import OpsRoutes, PredictRoute
from appliance.serving.routes_pool import PoolRoutes

ENGINE_QUEUE = "/engine-queue"  # LitServe keys a request queue by it (unused: server.py); not a route


class ApplianceSpec(LitSpec):
    def __init__(self, cfg, cfg_container: dict, shared, spool_dir: str, kind: str, requests, events):
        """`requests`, `events`: the HTTP side's ends of the pipes to and from the engine loop."""
        super().__init__()
        self.api_path = ENGINE_QUEUE
        self.frontend = Frontend(cfg_container, shared, requests, events)
        ops = OpsRoutes(self.frontend, cfg)
        for path, handler in (("/health", ops.health), ("/ready", ops.ready), ("/version", ops.version),
                              ("/metrics", ops.metrics)):
            self.add_endpoint(path, handler, ["GET"])
        if kind == "generate":
            routes = GenerateRoutes(self.frontend, cfg)
            self.add_endpoint("/v1/models", ops.models, ["GET"])
            self.add_endpoint("/v1/chat/completions", routes.chat, ["POST"])
            self.add_endpoint("/v1/completions", routes.completions, ["POST"])
        elif kind == "pool":
            routes = PoolRoutes(self.frontend, cfg, spool_dir)
            self.add_endpoint("/v1/models", ops.models, ["GET"])
            self.add_endpoint("/pooling", routes.pooling, ["POST"])
            self.add_endpoint("/v1/pool", routes.raw, ["POST"])
        else:
            self.add_endpoint("/predict", PredictRoute(self.frontend, cfg).predict, ["POST"])

    def route_paths(self):
        return [path for path, _, _ in self.endpoints]

    def __getstate__(self):
        """The engine process gets the spec too (inside the LitAPI) but serves no route."""
        state = super().__getstate__()
        state.update(frontend=None, _endpoints=[], response_buffer=None, request_queue=None)
        return state

    def decode_request(self, request, context_kwargs=None):
        raise NotImplementedError("routes parse their own bodies")

    def encode_response(self, output, context_kwargs=None):
        raise NotImplementedError("routes shape their own answers")


def serve_plain(app, paths: List[str]) -> Tuple[Dict[str, Route], list]:
    """Serve `paths` with Starlette routes instead of the app's FastAPI routes. Returns the new routes by
    path (middleware.Gate calls them), and the FastAPI routes taken out (for the OpenAPI document)."""
    plain, replaced = {}, []
    for index, route in enumerate(app.router.routes):
        if isinstance(route, APIRoute) and route.path in paths:
            app.router.routes[index] = plain[route.path] = Route(route.path, Endpoint(route.endpoint),
                                                                 methods=sorted(route.methods))
            replaced.append(route)
    return plain, replaced


class Endpoint:
    """The ASGI app of a route whose handler takes a Request and returns a Response: what Starlette's
    `request_response` makes of it, less its exception layer and that layer's wrapper around every
    `send`. It answers the handler's API errors with the handlers the app registers (server.py) and
    returns the answer's status, which middleware.Gate counts (so no wrapper there either)."""

    def __init__(self, handler):
        self.handler = handler

    async def __call__(self, scope, receive, send) -> int:
        request = Request(scope, receive, send)
        try:
            response = await self.handler(request)
        except (APIError, HTTPException) as error:
            handler = api_error_handler if isinstance(error, APIError) else http_exception_handler
            response = await handler(request, error)
        await response(scope, receive, send)
        return response.status_code
