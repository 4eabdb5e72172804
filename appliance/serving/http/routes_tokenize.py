"""vLLM's `POST /tokenize` and `POST /detokenize` (generating pipelines only).

The bodies are parsed here (appliance/protocol/tokenize.py); the work happens in the engine process,
which holds the tokenizer, the chat template and the image preprocessing (a chat's images count as
the placeholder tokens a chat completion would run), through the same admission and events as every
other request.
"""
from starlette.requests import Request
from starlette.responses import JSONResponse

from appliance.errors import InputError
from appliance.protocol.openai_responses import new_id
from appliance.protocol.tokenize import parse_detokenize, parse_tokenize
from appliance.serving.http.errors import APIError, error_response, read_json
from appliance.serving.http.frontend import ClientGone, Frontend
from appliance.serving.http.routes_generate import check_model
from appliance.serving.messages import DetokenizeJob, Done, Failed, TokenizeJob


class TokenizeRoutes:
    def __init__(self, frontend: Frontend, cfg):
        self.frontend = frontend
        self.media_dir = cfg.server.allowed_local_media_dir

    async def tokenize(self, request: Request):
        body = await read_json(request)
        try:
            parsed = parse_tokenize(body)
        except InputError as e:
            raise APIError.from_input(e) from None
        check_model(parsed.model, self.frontend.model_name)
        return await self._run(request, TokenizeJob(parsed, self.media_dir))

    async def detokenize(self, request: Request):
        body = await read_json(request)
        try:
            parsed = parse_detokenize(body)
        except InputError as e:
            raise APIError.from_input(e) from None
        check_model(parsed.model, self.frontend.model_name)
        return await self._run(request, DetokenizeJob(parsed.tokens))

    async def _run(self, request: Request, job) -> JSONResponse:
        channel = self.frontend.open(new_id("tok"), request)
        try:
            self.frontend.submit(channel, job)
            event = await self.frontend.next_event(channel)
            if isinstance(event, Failed):
                return error_response(event.status, event.message, event.param)
            assert isinstance(event, Done)
            return JSONResponse(event.result)
        except ClientGone:
            return JSONResponse({}, status_code=499)  # nobody reads it; the job was dropped
        finally:
            self.frontend.close(channel)
