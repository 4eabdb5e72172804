"""The routes of `appliance serve`, as a LitSpec: LitServe adds them to its FastAPI app.

The route table (route_table.py) says which routes a server of the pipeline's kind serves: a generating
engine gets OpenAI's `/v1/chat/completions`, `/v1/completions` and `/v1/models`, and vLLM's `/tokenize`,
`/detokenize` and `/tokenizer_info`; a pooling engine gets vLLM's `/pooling`, the raw `/v1/pool` and the
scene jobs of `/v1/scenes`; a pipeline without an engine gets `POST /predict`. Every server has
`/health`, `/ready`, `/version`, `/metrics` and `/openapi.json`, and the pages for people: `/docs` and,
with `server.ui`, the kind's page at `/` (appliance/serving/ui). The API routes are added here; the
pages are answered ahead of LitServe's own `GET /` (pages.py). The handlers read their own bodies and
answer Starlette responses; what they need of the engine goes through the `Frontend` (frontend.py),
never through LitServe's request queue, so LitServe's `decode_request` / `encode_response` hooks are
not used.
"""
import dataclasses
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

from litserve.specs.base import LitSpec

from appliance.serving.http.body_types import json_only
from appliance.serving.http.form_body import form_schema
from appliance.serving.http.frontend import Frontend
from appliance.serving.http.route_table import FORM, JSON, Ref, Route, served
from appliance.serving.http.routes_generate import GenerateRoutes
from appliance.serving.http.routes_ops import OpsRoutes, PredictRoute
from appliance.serving.http.routes_pool import PoolRoutes
from appliance.serving.http.routes_scenes import SceneRoutes
from appliance.serving.http.routes_tiles import SceneTileRoutes
from appliance.serving.http.routes_tokenize import TokenizeRoutes
from appliance.serving.http.served_routes import ServedRoutes
from appliance.serving.online_stages import ServedKind
from appliance.serving.ui.routes import PageFiles


@dataclass
class Handlers:
    """The objects whose methods answer the routes (route_table.py's `handler`s): those of the kind."""
    ops: OpsRoutes
    pages: PageFiles
    generate: Optional[GenerateRoutes] = None
    tokenize: Optional[TokenizeRoutes] = None
    pool: Optional[PoolRoutes] = None
    scenes: Optional[SceneRoutes] = None
    tiles: Optional[SceneTileRoutes] = None
    predict: Optional[PredictRoute] = None


class ApplianceSpec(LitSpec):
    def __init__(self, cfg, cfg_container: dict, shared, spool_dir: str, online, requests, events):
        """`online`: the pipeline's online stages (online_stages.OnlinePipeline); `requests`, `events`: the
        HTTP side's ends of the pipes to and from the engine loop."""
        kind = online.kind
        super().__init__()
        self.frontend = Frontend(cfg_container, shared, requests, events)
        handlers = self._handlers(kind, cfg, spool_dir, online)
        routes = served(kind, bool(cfg.server.ui))
        if handlers.scenes is not None:  # a multi-date model's form of dates; a one-date model's JSON by url
            frames = handlers.scenes.frames
            extra = {FORM: form_schema(frames)} if frames > 1 else {JSON: Ref("appliance.protocol.scenes",
                                                                              "OneDateSceneBody")}
            routes = [dataclasses.replace(route, body={**route.body, **extra})
                      if route.handler(handlers) == handlers.scenes.create else route for route in routes]
        self.routes = ServedRoutes(routes)
        # The API's main route. LitServe keys the inference worker's request queue by it, a queue our
        # routes leave unused: jobs reach the engine loop over our own pipe (docs/serving.md).
        self.api_path = next(route.path for route in routes if route.main)
        self.pages: List[Tuple[Route, Callable]] = []
        for route in routes:
            handler = route.handler(handlers)
            if route.page:
                self.pages.append((route, handler))
            else:
                self.add_endpoint(route.path, json_only(route, handler) if route.json_only else handler,
                                  list(route.methods))

    def _handlers(self, kind: ServedKind, cfg, spool_dir: str, online) -> Handlers:
        handlers = Handlers(OpsRoutes(self.frontend, cfg), PageFiles(kind))
        if kind is ServedKind.generate:
            handlers.generate = GenerateRoutes(self.frontend, cfg, dict(online.engine.options.sampling))
            handlers.tokenize = TokenizeRoutes(self.frontend, cfg)
        elif kind is ServedKind.pool:
            handlers.pool = PoolRoutes(self.frontend, cfg, spool_dir)
            handlers.scenes = SceneRoutes(self.frontend, cfg, spool_dir)
            handlers.tiles = SceneTileRoutes(handlers.scenes.jobs)
        else:
            handlers.predict = PredictRoute(self.frontend, cfg)
        return handlers

    def setup(self, server) -> None:
        """LitServe's hook, in the main process, after `run()` configured LitServe's logging in its own
        format and before it forks the HTTP process: send LitServe's records to ours again, in both."""
        super().setup(server)
        from appliance.logs import adopt_library_loggers

        adopt_library_loggers()

    @property
    def stream(self) -> bool:
        """True: our routes write their own bodies, SSE streams among them. (LitServe adds gzip to an API
        that does not stream; it would compress a base64 GeoTIFF answer on the event loop, holding every
        other request meanwhile; OpenAI-compatible servers answer uncompressed, a proxy may compress.)"""
        return True
