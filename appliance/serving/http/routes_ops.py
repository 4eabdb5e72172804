"""Routes every server has: probes, version, metrics, models; and `POST /predict` for pipelines without
an engine stage (the record of `pipeline.inputs` in, the records the pipeline yields out)."""
import asyncio
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from appliance import __version__
from appliance.errors import InputError
from appliance.fetch.local_files import allowed_path
from appliance.protocol import probes
from appliance.protocol.openai_responses import new_id
from appliance.serving.http.errors import APIError, error_response, read_json
from appliance.serving.http.frontend import Frontend
from appliance.serving.messages import PredictJob
from appliance.serving.state import DEAD, READY
from appliance.vision.image_load import is_remote_image

PATH_FIELDS = {"input", "output"}  # the run verb's file fields: they name files on the server


class OpsRoutes:
    def __init__(self, frontend: Frontend, cfg):
        self.frontend = frontend
        self.pipeline = cfg.pipeline.name
        self.created = int(time.time())

    async def health(self, request: Request):
        if self.frontend.shared.phase == DEAD:
            return JSONResponse({"status": probes.DEAD}, status_code=503)
        return JSONResponse({"status": probes.ALIVE})

    async def ready(self, request: Request):
        shared = self.frontend.shared
        if shared.phase != READY or shared.draining:
            state = probes.DRAINING if shared.draining else (probes.DEAD if shared.phase == DEAD else probes.LOADING)
            return JSONResponse({"status": state}, status_code=503)
        return JSONResponse({"status": probes.READY})

    async def version(self, request: Request):
        return JSONResponse({"version": __version__, "pipeline": self.pipeline, "model": self.frontend.model_name})

    async def metrics(self, request: Request):
        from appliance.serving.metrics import render

        return Response(await asyncio.to_thread(render), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def openapi(self, request: Request):
        """The OpenAPI document (openapi.py): our route, in place of FastAPI's (LitServer(disable_openapi_url=True))."""
        return JSONResponse(request.app.openapi())

    async def models(self, request: Request):
        return JSONResponse({"object": "list", "data": [self._card()]})

    async def model(self, request: Request):
        """`GET /v1/models/{id}` (the openai client's `models.retrieve`): the served model's card, or 404."""
        requested = request.path_params["model_id"]
        if requested != self.frontend.model_name:
            return error_response(404, f"The model '{requested}' does not exist; this server serves "
                                       f"'{self.frontend.model_name}'", "model")
        return JSONResponse(self._card())

    def _card(self) -> dict:
        return {"id": self.frontend.model_name, "object": "model", "created": self.created, "owned_by": "appliance",
                "root": self.frontend.model_name, "parent": None}


class PredictRoute:
    def __init__(self, frontend: Frontend, cfg):
        self.frontend = frontend
        self.inputs = list(cfg.pipeline.inputs)
        self.media_dir = cfg.server.allowed_local_media_dir

    async def predict(self, request: Request):
        body = await read_json(request)
        if not isinstance(body, dict):
            raise APIError(400, "body: expected a JSON object with the pipeline's inputs")
        unknown = sorted(set(body) - set(self.inputs))
        if unknown:
            raise APIError(400, f"{unknown[0]}: unknown field (allowed: {', '.join(self.inputs)})", param=unknown[0])
        record = {field: body.get(field) for field in self.inputs}
        for field in PATH_FIELDS.intersection(body):
            record[field] = self._resolve(field, body[field])
        return await self.frontend.answer_once(request, new_id("predict"), PredictJob(record))

    def _resolve(self, field: str, value: Any) -> Any:
        """Client-named server files only inside `server.allowed_local_media_dir` (`allowed_path`)."""
        resolved = []
        for path in value if isinstance(value, list) else [value]:
            try:
                resolved.append(path if path is None or is_remote_image(path) else
                                allowed_path(path, self.media_dir, field))
            except InputError as e:
                raise APIError.from_input(e) from None
        return resolved if isinstance(value, list) else resolved[0]
