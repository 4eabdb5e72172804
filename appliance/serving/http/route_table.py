"""The routes of `appliance serve`, each stated once (`ROUTES`) with every fact the server and its help read.

spec.py adds the API routes to LitServe's app and pages.py serves the pages ahead of it; middleware.py
reads which routes need the key (`auth`); errors.py which methods a path has (a 405's `Allow`) and which
routes there are (a 404's message); body_types.py which types a body may have (415); openapi.py the
schemas of body and answer; `appliance serve --help` each route's one line (`routes_help`). A path may
have one Route per method (each its own handler).

This module imports no model: `serve --help` reads it and must not wait for torch (which some protocol
models import). So a schema is named by `Ref` and imported when the OpenAPI document is built: a pydantic model,
a tuple of models one of which the body is (a text or a chat), or a plain JSON schema (bytes: a GeoTIFF, a
PNG). A streamed answer's schema is that of one event's data. A handler is a function of the server's
`Handlers` (spec.py), whose objects answer the routes of its kind: an attrgetter, which the inference worker
can unpickle with the rest of the spec (LitServe sends it there).
"""
import dataclasses
import importlib
import re
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Callable, Dict, List, Tuple

JSON, SSE, FORM = "application/json", "text/event-stream", "multipart/form-data"
GEOTIFF_TYPES = ("image/tiff", "image/geotiff", "application/octet-stream")  # a GeoTIFF as the body
BYTES = {"type": "string", "format": "binary"}
GET, POST, DELETE, PAGE = ("GET",), ("POST",), ("DELETE",), ("GET", "HEAD")
GENERATE, POOL, PLAIN = ("generate",), ("pool",), ("plain",)  # the engine kinds a route is served for
ENGINES, EVERY = GENERATE + POOL, GENERATE + POOL + PLAIN


@dataclass(frozen=True)
class Ref:
    """An object of another module, imported when first read (a protocol model, a constant)."""
    module: str
    name: str

    def load(self) -> Any:
        return getattr(importlib.import_module(self.module), self.name)


def resolved(value: Any) -> Any:
    """`value` with every Ref in it (in dicts and tuples, a Route's schemas too) replaced by what it names."""
    if isinstance(value, Route):
        return dataclasses.replace(value, body=resolved(value.body), answers=resolved(value.answers),
                                   query=resolved(value.query), params=resolved(value.params))
    if isinstance(value, Ref):
        return value.load()
    if isinstance(value, dict):
        return {key: resolved(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return tuple(resolved(item) for item in value)
    return value


def _openai(name: str) -> Ref:
    return Ref("appliance.protocol.openai_models", name)


def _answer(name: str) -> Ref:
    return Ref("appliance.protocol.openai_answers", name)


def _tokenize(name: str) -> Ref:
    return Ref("appliance.protocol.tokenize", name)


def _scenes(name: str) -> Ref:
    return Ref("appliance.protocol.scenes", name)


def _probes(name: str) -> Ref:
    return Ref("appliance.protocol.probes", name)


def _pooling(name: str) -> Ref:
    return Ref("appliance.protocol.pooling", name)


@dataclass(frozen=True)
class Route:
    path: str                      # Starlette's form: a typed parameter is `{model_id:path}`
    methods: Tuple[str, ...]
    handler: Callable              # Handlers -> the function that answers the route (spec.py)
    help: str                      # one line, for `appliance serve --help`
    kinds: Tuple[str, ...] = EVERY  # the engine kinds whose servers serve it
    auth: bool = True              # needs the API key (when the server has one)
    page: bool = False             # a page's file: served ahead of LitServe's routes (pages.py), no API
    ui: bool = False               # served only with `server.ui`
    main: bool = False             # the kind's main route: LitServe's `api_path` (spec.py)
    body: Dict[str, Any] = field(default_factory=dict)     # content type -> the body's schema
    answers: Dict[str, Any] = field(default_factory=dict)  # content type -> the 200 answer's schema
    query: Dict[str, Any] = field(default_factory=dict)    # query parameter -> its schema (all optional)
    params: Dict[str, Any] = field(default_factory=dict)   # path parameter -> its schema (default: a string)
    status: str = "200"            # the status of a success (a job accepted: 202)
    headers: Dict[str, str] = field(default_factory=dict)  # a success's headers -> what they say
    documented: bool = True        # False: left out of /openapi.json and a 404's list (pages, the document)
    queued: bool = False           # answered by the engine through the request queue (frontend.py)
    errors: Tuple[int, ...] = ()   # statuses of its own beyond those `statuses` derives (a scene not done: 409)
    alike: Tuple[int, ...] = ()    # statuses answered with the success's schema (a probe's 503)

    @property
    def openapi_path(self) -> str:
        """The path as OpenAPI writes it: `{model_id:path}` -> `{model_id}`."""
        return re.sub(r"\{(\w+):\w+\}", r"{\1}", self.path)

    def statuses(self, keyed: bool) -> Tuple[int, ...]:
        """Every status the route can answer besides its success (`keyed`: the server has an API key): 400
        for what it reads that breaks its rules, 401 without the key, 404 for a path parameter naming
        nothing, 413 and 415 for a body too large or of another type, and for a queued route 429 (queue
        full), 500 (the engine failed it), 503 (the server stops) and 504 (past the deadline)."""
        found = set(self.errors) | set(self.alike)
        found |= {400} if self.body or self.query or "{" in self.path else set()
        found |= {401} if keyed and self.auth else set()
        found |= {404} if "{" in self.path else set()
        found |= {413, 415} if self.body else set()
        found |= {429, 500, 503, 504} if self.queued else set()
        return tuple(sorted(found))

    @property
    def json_only(self) -> bool:
        """True when the body is JSON and nothing else (body_types.py refuses any other type)."""
        return set(self.body) == {JSON}


def _page(path: str, handler: Callable, help: str, ui: bool = False) -> Route:
    """A page's route: open, served ahead of LitServe's routes, no API."""
    return Route(path, PAGE, handler, help, auth=False, page=True, ui=ui, documented=False)


INDEX = "/index.html"  # the page's own path: where a proxy's prefix is sent (ui/routes.py)
DATE_QUERY = {"type": "string", "examples": ["2024-06-30"],  # /v1/pool's and /v1/scenes' `?date=`
              "description": "the scene's acquisition date, YYYY-MM-DD, for models with a time encoding"}
GEOTIFF_BODY = {kind: BYTES for kind in GEOTIFF_TYPES}
SCENE_FILE = {"type": "string", "enum": _scenes("SCENE_FILES")}
TILE_LAYER = {"type": "string", "enum": _scenes("TILE_LAYERS")}
TILE_INDEX = {"type": "integer", "minimum": 0, "maximum": Ref("appliance.stages.geo.map_tiles", "MAX_TILE_INDEX"),
              "description": "below 2 ** z"}
TILE_ZOOM = {"type": "integer", "minimum": 0, "maximum": Ref("appliance.stages.geo.map_tiles", "MAX_ZOOM")}

ROUTES: Tuple[Route, ...] = (
    # every server
    Route("/health", GET, attrgetter("ops.health"), "200 while the engine lives, 503 once it died", auth=False,
          answers={JSON: _probes("Health")}, alike=(503,)),
    Route("/ready", GET, attrgetter("ops.ready"), "200 once the model is loaded and warm", auth=False,
          answers={JSON: _probes("Readiness")}, alike=(503,)),
    Route("/version", GET, attrgetter("ops.version"), "the version, pipeline and model", auth=False,
          answers={JSON: _probes("Version")}),
    Route("/metrics", GET, attrgetter("ops.metrics"), "Prometheus metrics", auth=False,
          answers={"text/plain": {"type": "string", "description": "Prometheus' text format, version 0.0.4"}}),
    Route("/openapi.json", GET, attrgetter("ops.openapi"), "this API's OpenAPI document", auth=False,
          documented=False),
    _page("/", attrgetter("pages.index"), "the page for people (server.ui)", ui=True),
    _page(INDEX, attrgetter("pages.index"), "the same page, at the path a proxy's prefix names", ui=True),
    _page("/docs", attrgetter("pages.docs"), "the API docs (Swagger UI), a page"),
    _page("/docs.html", attrgetter("pages.docs"), "the API docs, at their former path"),
    _page("/redoc", attrgetter("pages.docs"), "the API docs, at FastAPI's other path"),
    _page("/ui/{file:path}", attrgetter("pages.asset"), "the pages' scripts and styles"),
    # engines
    Route("/v1/models", GET, attrgetter("ops.models"), "the served model", kinds=ENGINES,
          answers={JSON: _answer("ModelList")}),
    Route("/v1/models/{model_id:path}", GET, attrgetter("ops.model"), "the served model's card", kinds=ENGINES,
          answers={JSON: _answer("ModelCard")}),
    # generate
    Route("/v1/chat/completions", POST, attrgetter("generate.chat"), "OpenAI chat completions, streamed or not",
          kinds=GENERATE, main=True, body={JSON: _openai("ChatCompletionRequest")}, queued=True, errors=(404,),
          answers={JSON: _answer("ChatCompletion"), SSE: _answer("ChatCompletionChunk")}),
    Route("/v1/completions", POST, attrgetter("generate.completions"), "OpenAI completions, streamed or not",
          kinds=GENERATE, body={JSON: _openai("CompletionRequest")}, queued=True, errors=(404,),
          answers={JSON: _answer("Completion"), SSE: _answer("CompletionChunk")}),
    Route("/tokenize", POST, attrgetter("tokenize.tokenize"), "a text or a chat as the model's token ids (vLLM's)",
          kinds=GENERATE, body={JSON: (_tokenize("TokenizeCompletionBody"), _tokenize("TokenizeChatBody"))},
          queued=True, errors=(404,),
          answers={JSON: _tokenize("TokenizeResponse")}),
    Route("/detokenize", POST, attrgetter("tokenize.detokenize"), "token ids back to text (vLLM's)", kinds=GENERATE,
          body={JSON: _tokenize("DetokenizeBody")}, answers={JSON: _tokenize("DetokenizeResponse")}, queued=True,
          errors=(404,)),
    Route("/tokenizer_info", GET, attrgetter("tokenize.tokenizer_info"), "the tokenizer's settings (vLLM's)",
          kinds=GENERATE, answers={JSON: _tokenize("TokenizerInfoResponse")}, queued=True),
    # pool
    Route("/pooling", POST, attrgetter("pool.pooling"), "a GeoTIFF scene in vLLM's IO-processor body", kinds=POOL,
          main=True, body={JSON: _pooling("PoolingBody")}, answers={JSON: _pooling("PoolingResponse")}, queued=True,
          errors=(404,)),
    Route("/v1/pool", POST, attrgetter("pool.raw"), "a GeoTIFF as the body, its mask (or quicklook) as the answer",
          kinds=POOL, body=GEOTIFF_BODY, query={"quicklook": {"type": "boolean"}, "date": DATE_QUERY},
          answers={"image/tiff": BYTES, "image/png": BYTES}, queued=True),
    # `/v1/scenes`: a scene job is accepted (202) at once, then polled, then its files fetched. A multi-date
    # model's server also takes its dates as a form of files (spec.py adds the form: form_body.py).
    Route("/v1/scenes", POST, attrgetter("scenes.create"), "a scene as a job: a GeoTIFF, a URL, a form of dates",
          kinds=POOL,
          body={**GEOTIFF_BODY, JSON: _scenes("SceneBody")},
          query={"date": {**DATE_QUERY, "description": f"{DATE_QUERY['description']}; with a GeoTIFF body only "
                                                       "(a JSON body or a form carries its own)"}},
          status="202", answers={JSON: _scenes("Scene")}, errors=(429, 503),
          headers={"Location": "the scene's URL, relative: scenes/{id}"}),
    Route("/v1/scenes", GET, attrgetter("scenes.list"), "the scenes kept", kinds=POOL,
          answers={JSON: _scenes("SceneList")}),
    Route("/v1/scenes/{id}", GET, attrgetter("scenes.get"), "a scene: its progress, then its summary", kinds=POOL,
          answers={JSON: _scenes("Scene")}),
    Route("/v1/scenes/{id}", DELETE, attrgetter("scenes.delete"), "stop a scene and delete its files", kinds=POOL,
          answers={JSON: _scenes("SceneDeleted")}),
    Route("/v1/scenes/{id}/tiles/{layer}/{z}/{x}/{y}.png", GET, attrgetter("tiles.tile"),
          "a done scene's map tile: 256-px PNG, Web Mercator XYZ", kinds=POOL,
          params={"layer": TILE_LAYER, "z": TILE_ZOOM, "x": TILE_INDEX, "y": TILE_INDEX}, errors=(409,),
          answers={"image/png": BYTES}),
    Route("/v1/scenes/{id}/tiles/{layer}/tilejson.json", GET, attrgetter("tiles.tilejson"),
          "a layer's TileJSON: URL template, bounds, zooms", kinds=POOL, params={"layer": TILE_LAYER},
          errors=(409,), answers={JSON: _scenes("TileJSON")}),
    Route("/v1/scenes/{id}/{file}", GET, attrgetter("scenes.file"), "a done scene's file", kinds=POOL,
          params={"file": SCENE_FILE}, errors=(409,),
          answers={"image/tiff": BYTES, "image/png": BYTES,
                   "application/geo+json": {"type": "object", "description": "the scene's STAC item, a GeoJSON "
                                                                                "Feature (item.json)"}}),
    # plain
    Route("/predict", POST, attrgetter("predict.predict"), "the pipeline's inputs in, its records out", kinds=PLAIN,
          main=True, body={JSON: {"type": "object", "description": "the pipeline's inputs"}}, queued=True),
)


def served(kind: str, ui: bool) -> List[Route]:
    """The routes a server of this engine kind serves (`ui`: `server.ui`)."""
    return [route for route in ROUTES if kind in route.kinds and (ui or not route.ui)]


HELP_COLUMN = 38  # where `serve --help` starts a route's help: 4 + 8 (methods) + 1 + 24 (path) + 1


def routes_help() -> str:
    """`appliance serve --help`'s list of routes: by engine kind, then those of every server."""
    groups = [("generate (llava_chat)", GENERATE), ("pool (prithvi_flood)", POOL), ("plain (no engine stage)", PLAIN),
              ("generate and pool", ENGINES), ("every pipeline", EVERY)]
    lines = []
    for title, kinds in groups:
        lines.append(f"  {title}:")
        for route in ROUTES:
            if route.kinds == kinds:
                key = "" if route.auth else " (open)"
                start = f"    {' '.join(route.methods):<8} {route.openapi_path:<24} "
                if len(start) > HELP_COLUMN:  # a long path: its help on the next line, in the column (as argparse)
                    lines.append(start.rstrip())
                    start = " " * HELP_COLUMN
                lines.append(f"{start}{route.help}{key}")
    return "\n".join(lines)
