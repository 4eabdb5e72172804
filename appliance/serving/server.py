"""`appliance serve`: the pipeline behind an HTTP endpoint (LitServe).

POST /predict with a JSON object whose keys are the pipeline's `inputs`; the answer is the list of
records the pipeline's last stage yields (their JSON-serialisable fields). Bad input is a 4xx whose
message names the field.
"""
import logging
import math
import multiprocessing
import signal
from pathlib import Path
from typing import Any, Dict, List

import litserve as ls
from fastapi import HTTPException
from omegaconf import DictConfig, OmegaConf
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.responses import JSONResponse

from appliance.errors import UserError
from appliance.pipeline import Pipeline, build_pipeline
from appliance.vision.image_load import is_remote_image

log = logging.getLogger(__name__)
OPEN_PATHS = ("/health", "/info")
PATH_FIELDS = {"input", "output"}  # the run verb's file fields: they name files on the server


class PipelineAPI(ls.LitAPI):
    def __init__(self, cfg: DictConfig):
        super().__init__(api_path="/predict")
        # LitServe pickles the API into its worker process; a plain container travels safely.
        self.cfg_container = OmegaConf.to_container(cfg)
        self.pipeline: Pipeline = None

    def setup(self, device):
        self.pipeline = build_pipeline(OmegaConf.create(self.cfg_container))
        self.pipeline.setup()

    def decode_request(self, request: Dict[str, Any]) -> Dict[str, Any]:
        if not isinstance(request, dict):
            raise HTTPException(422, "request body: expected a JSON object")
        allowed = self.cfg_container["pipeline"]["inputs"]
        unknown = sorted(set(request) - set(allowed))
        if unknown:
            raise HTTPException(422, f"{unknown[0]}: unknown field (allowed: {', '.join(allowed)})")
        record = {field: request.get(field) for field in allowed}
        for field in PATH_FIELDS.intersection(request):
            record[field] = self._resolve_paths(field, request[field])
        return record

    def _resolve_paths(self, field: str, value: Any) -> Any:
        """A client may name server-side files only inside `server.allowed_local_media_dir`; relative
        names are taken from that directory (not the server's working directory)."""
        media_dir = self.cfg_container["server"]["allowed_local_media_dir"]
        resolved = []
        for path in value if isinstance(value, list) else [value]:
            if path is None or is_remote_image(path):  # not a server file: the loader applies its limits
                resolved.append(path)
                continue
            if not media_dir:
                raise HTTPException(422, f"{field}: server-side paths are refused; start the server with "
                                         "server.allowed_local_media_dir=DIR to allow files under DIR")
            root = Path(media_dir).resolve()
            full = Path(root, path).resolve() if isinstance(path, str) else None
            if full is None or not full.is_relative_to(root):
                raise HTTPException(422, f"{field}: {path!r} is outside the allowed directory {root}")
            resolved.append(str(full))
        return resolved if isinstance(value, list) else resolved[0]

    def predict(self, record: Dict[str, Any]) -> List[Dict[str, Any]]:
        try:
            return [_jsonable(result) for result in self.pipeline.run([record])]
        except UserError as e:
            raise HTTPException(422, str(e)) from None

    def encode_response(self, results: List[Dict[str, Any]]) -> Dict[str, Any]:
        return {"results": results}


def _jsonable(record: Dict[str, Any]) -> Dict[str, Any]:
    """Keep the fields a client can read; tensors and arrays stay on the server."""
    return {k: v for k, v in record.items() if isinstance(v, (str, int, bool, type(None))) or
            (isinstance(v, float) and math.isfinite(v))}


class APIKeyMiddleware(BaseHTTPMiddleware):
    """`Authorization: Bearer KEY` (OpenAI clients) or `X-API-Key: KEY`; health stays open for probes."""

    def __init__(self, app, api_key: str):
        super().__init__(app)
        self.api_key = api_key

    async def dispatch(self, request, call_next):
        if request.url.path not in OPEN_PATHS:
            given = request.headers.get("x-api-key") or request.headers.get("authorization", "").removeprefix("Bearer ")
            if given != self.api_key:
                return JSONResponse({"detail": "missing or wrong API key"}, status_code=401)
        return await call_next(request)


def serve(cfg: DictConfig, pipeline: Pipeline) -> int:
    pipeline.check()
    middlewares = [(APIKeyMiddleware, {"api_key": cfg.server.api_key})] if cfg.server.api_key else []
    server = ls.LitServer(
        PipelineAPI(cfg),
        accelerator="cpu" if cfg.engine.device == "cpu" else "auto",
        timeout=cfg.server.limits.request_timeout_s,
        middlewares=middlewares,
    )
    log.warning("serving pipeline %s on http://%s:%d", cfg.pipeline.name, cfg.server.host, cfg.server.port)
    # Kubernetes and test harnesses stop servers with SIGTERM: treat it like Ctrl-C so LitServe's
    # graceful shutdown stops its worker processes instead of orphaning them.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        server.run(host=cfg.server.host, port=cfg.server.port, generate_client_file=False, log_level="warning")
    finally:
        # LitServe's shutdown can leave its inference worker blocked on a queue; stop what is left.
        for child in multiprocessing.active_children():
            child.terminate()
            child.join(timeout=10)
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt
