"""The routes of `appliance serve`, as a LitSpec: LitServe adds them to its FastAPI app.

The pipeline's kind decides the API: a generating engine gets OpenAI's `/v1/chat/completions`,
`/v1/completions` and `/v1/models`, and vLLM's `/tokenize`, `/detokenize` and `/tokenizer_info`; a pooling engine gets
vLLM's `/pooling`, the raw `/v1/pool` and the scene jobs of `/v1/scenes`; a pipeline without an engine gets
`POST /predict`. Every
server has `/health`, `/ready`, `/version` and `/metrics`, and the pages for people: `/docs` and, with
`server.ui`, the kind's page at `/` (appliance/serving/ui). `routes` is the table of them all, each
`Route` with the schemas the OpenAPI document shows (openapi.py reads the same table). The handlers
read their own bodies and answer Starlette responses; what they need of the engine goes through the
`Frontend` (frontend.py), never through LitServe's request queue, so LitServe's `decode_request` /
`encode_response` hooks are not used.
"""
from typing import List

from litserve.specs.base import LitSpec

from appliance.protocol.openai_answers import ChatCompletion, ChatCompletionChunk, Completion, CompletionChunk
from appliance.protocol.openai_answers import ModelCard, ModelList
from appliance.protocol.openai_models import ChatCompletionRequest, CompletionRequest
from appliance.protocol.pooling import GEOTIFF_TYPES, PoolingBody, PoolingResponse
from appliance.protocol.scenes import SCENE_FILES, Scene, SceneBody, SceneDeleted, SceneList
from appliance.protocol.tokenize import (DetokenizeBody, DetokenizeResponse, TokenizeChatBody,
                                         TokenizeCompletionBody, TokenizerInfoResponse, TokenizeResponse)
from appliance.serving.http.form_body import FORM_TYPE, form_schema
from appliance.serving.http.frontend import Frontend
from appliance.serving.http.route_table import BYTES, GET, JSON, POST, SSE, Route
from appliance.serving.http.routes_generate import GenerateRoutes
from appliance.serving.http.routes_ops import OpsRoutes, PredictRoute
from appliance.serving.http.routes_pool import PoolRoutes
from appliance.serving.http.routes_scenes import SceneRoutes
from appliance.serving.http.routes_tokenize import TokenizeRoutes
from appliance.serving.ui.routes import page_routes


DATE_QUERY = {"type": "string", "examples": ["2024-06-30"],  # /v1/pool's and /v1/scenes' `?date=`
              "description": "the scene's acquisition date, YYYY-MM-DD, for models with a time encoding"}
MAIN_ROUTE = {"generate": "/v1/chat/completions", "pool": "/pooling", "plain": "/predict"}


class ApplianceSpec(LitSpec):
    def __init__(self, cfg, cfg_container: dict, shared, spool_dir: str, online, requests, events):
        """`online`: the pipeline's online stages (online_stages.OnlinePipeline); `requests`, `events`: the HTTP
        side's ends of the pipes to and from the engine loop."""
        kind = online.kind
        super().__init__()
        # The API's main route. LitServe keys the inference worker's request queue by it, a queue our
        # routes leave unused: jobs reach the engine loop over our own pipe (docs/serving.md).
        self.api_path = MAIN_ROUTE[kind]
        self.frontend = Frontend(cfg_container, shared, requests, events)
        ops = OpsRoutes(self.frontend, cfg)
        self.routes: List[Route] = [
            Route("/health", GET, ops.health), Route("/ready", GET, ops.ready),
            Route("/version", GET, ops.version), Route("/metrics", GET, ops.metrics),
            *(Route(path, ("GET", "HEAD"), page_file.answer, documented=False)
              for path, page_file in page_routes(kind, bool(cfg.server.ui)))]
        models = [Route("/v1/models", GET, ops.models, answers={JSON: ModelList}),
                  Route("/v1/models/{model_id:path}", GET, ops.model, answers={JSON: ModelCard})]
        if kind == "generate":
            generating = GenerateRoutes(self.frontend, cfg, dict(online.engine.options.sampling))
            tokenizing = TokenizeRoutes(self.frontend, cfg)
            self.routes += [
                *models,
                Route("/v1/chat/completions", POST, generating.chat, body={JSON: ChatCompletionRequest},
                      answers={JSON: ChatCompletion, SSE: ChatCompletionChunk}),
                Route("/v1/completions", POST, generating.completions, body={JSON: CompletionRequest},
                      answers={JSON: Completion, SSE: CompletionChunk}),
                Route("/tokenize", POST, tokenizing.tokenize, body={JSON: (TokenizeCompletionBody, TokenizeChatBody)},
                      answers={JSON: TokenizeResponse}),
                Route("/detokenize", POST, tokenizing.detokenize, body={JSON: DetokenizeBody},
                      answers={JSON: DetokenizeResponse}),
                Route("/tokenizer_info", GET, tokenizing.tokenizer_info, answers={JSON: TokenizerInfoResponse})]
        elif kind == "pool":
            pooling = PoolRoutes(self.frontend, cfg, spool_dir)
            self.routes += [
                *models,
                Route("/pooling", POST, pooling.pooling, body={JSON: PoolingBody}, answers={JSON: PoolingResponse}),
                Route("/v1/pool", POST, pooling.raw, body={"image/tiff": BYTES},
                      query={"quicklook": {"type": "boolean"}, "date": DATE_QUERY},
                      answers={"image/tiff": BYTES, "image/png": BYTES}),
                *scene_routes(SceneRoutes(self.frontend, cfg, spool_dir))]
        else:
            self.routes.append(Route("/predict", POST, PredictRoute(self.frontend, cfg).predict))
        for route in self.routes:
            self.add_endpoint(route.path, route.handler, list(route.methods))

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
        return [route.path for route in self.routes]


def scene_routes(scenes: SceneRoutes) -> List[Route]:
    """`/v1/scenes`: a scene job is accepted (202) at once, then polled, then its files fetched. A multi-date
    model's server also takes its dates as a form of files (form_body.py)."""
    form = {FORM_TYPE: form_schema(scenes.frames)} if scenes.frames > 1 else {}
    return [
        Route("/v1/scenes", POST, scenes.create, body={**{kind: BYTES for kind in GEOTIFF_TYPES}, JSON: SceneBody,
                                                       **form},
              query={"date": {**DATE_QUERY, "description": f"{DATE_QUERY['description']}; with a GeoTIFF body "
                                                           "only (a JSON body or a form carries its own)"}},
              status="202", answers={JSON: Scene}, headers={"Location": "the scene's URL, relative: scenes/{id}"}),
        Route("/v1/scenes", GET, scenes.list, answers={JSON: SceneList}),
        Route("/v1/scenes/{id}", GET, scenes.get, answers={JSON: Scene}),
        Route("/v1/scenes/{id}", ("DELETE",), scenes.delete, answers={JSON: SceneDeleted}),
        Route("/v1/scenes/{id}/{file}", GET, scenes.file,
              params={"file": {"type": "string", "enum": list(SCENE_FILES)}},
              answers={kind: BYTES for kind in ("image/tiff", "application/geo+json", "image/png")})]
