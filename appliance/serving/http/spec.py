"""The routes of `appliance serve`, as a LitSpec: LitServe adds them to its FastAPI app.

The pipeline's kind decides the API: a generating engine gets OpenAI's `/v1/chat/completions`,
`/v1/completions` and `/v1/models`, and vLLM's `/tokenize`, `/detokenize` and `/tokenizer_info`; a pooling engine gets
vLLM's `/pooling` and the raw `/v1/pool`; a pipeline without an engine gets `POST /predict`. Every
server has `/health`, `/ready`, `/version` and `/metrics`, and the pages for people: `/docs` and, with
`server.ui`, the kind's page at `/` (appliance/serving/ui). The handlers read their own bodies and
answer Starlette responses; what they need of the engine goes through the `Frontend` (frontend.py),
never through LitServe's request queue, so LitServe's `decode_request` / `encode_response` hooks are
not used.
"""
from litserve.specs.base import LitSpec

from appliance.serving.http.frontend import Frontend
from appliance.serving.http.routes_generate import GenerateRoutes
from appliance.serving.http.routes_ops import OpsRoutes, PredictRoute
from appliance.serving.http.routes_pool import PoolRoutes
from appliance.serving.http.routes_tokenize import TokenizeRoutes
from appliance.serving.ui.routes import page_routes


MAIN_ROUTE = {"generate": "/v1/chat/completions", "pool": "/pooling", "plain": "/predict"}


class ApplianceSpec(LitSpec):
    def __init__(self, cfg, cfg_container: dict, shared, spool_dir: str, online, requests, events):
        """`online`: the pipeline's online stages (split.OnlinePipeline); `requests`, `events`: the HTTP
        side's ends of the pipes to and from the engine loop."""
        kind = online.kind
        super().__init__()
        # The API's main route. LitServe keys the inference worker's request queue by it, a queue our
        # routes leave unused: jobs reach the engine loop over our own pipe (docs/serving.md).
        self.api_path = MAIN_ROUTE[kind]
        self.frontend = Frontend(cfg_container, shared, requests, events)
        ops = OpsRoutes(self.frontend, cfg)
        for path, handler in (("/health", ops.health), ("/ready", ops.ready), ("/version", ops.version),
                              ("/metrics", ops.metrics)):
            self.add_endpoint(path, handler, ["GET"])
        for path, page_file in page_routes(kind, bool(cfg.server.ui)):
            self.add_endpoint(path, page_file.answer, ["GET", "HEAD"])
        if kind == "generate":
            routes = GenerateRoutes(self.frontend, cfg, dict(online.engine.options.sampling))
            self.add_endpoint("/v1/models", ops.models, ["GET"])
            self.add_endpoint("/v1/models/{model_id:path}", ops.model, ["GET"])
            self.add_endpoint("/v1/chat/completions", routes.chat, ["POST"])
            self.add_endpoint("/v1/completions", routes.completions, ["POST"])
            tokenizing = TokenizeRoutes(self.frontend, cfg)
            self.add_endpoint("/tokenize", tokenizing.tokenize, ["POST"])
            self.add_endpoint("/detokenize", tokenizing.detokenize, ["POST"])
            self.add_endpoint("/tokenizer_info", tokenizing.tokenizer_info, ["GET"])
        elif kind == "pool":
            routes = PoolRoutes(self.frontend, cfg, spool_dir)
            self.add_endpoint("/v1/models", ops.models, ["GET"])
            self.add_endpoint("/v1/models/{model_id:path}", ops.model, ["GET"])
            self.add_endpoint("/pooling", routes.pooling, ["POST"])
            self.add_endpoint("/v1/pool", routes.raw, ["POST"])
        else:
            self.add_endpoint("/predict", PredictRoute(self.frontend, cfg).predict, ["POST"])

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

    def route_paths(self):
        return [path for path, _, _ in self.endpoints]
