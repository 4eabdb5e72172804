"""vLLM's `POST /tokenize`, `POST /detokenize` and `GET /tokenizer_info` (generating pipelines only).

The bodies are parsed here (appliance/protocol/tokenize.py); the work happens in the engine process,
which holds the tokenizer, the chat template and the image preprocessing (a chat's images count as
the placeholder tokens a chat completion would run), through the same admission and events as every
other request.
"""
from starlette.requests import Request

from appliance.protocol.openai_responses import new_id
from appliance.protocol.tokenize import parse_detokenize, parse_tokenize
from appliance.serving.http.errors import parse_body
from appliance.serving.http.frontend import Frontend
from appliance.serving.http.routes_generate import check_model
from appliance.serving.messages import DetokenizeJob, TokenizeJob, TokenizerInfoJob


class TokenizeRoutes:
    def __init__(self, frontend: Frontend, cfg):
        self.frontend = frontend
        self.media_dir = cfg.server.allowed_local_media_dir

    async def tokenize(self, request: Request):
        parsed = await parse_body(request, parse_tokenize)
        check_model(parsed.model, self.frontend.model_name)
        return await self.frontend.answer_once(request, new_id("tok"), TokenizeJob(parsed, self.media_dir))

    async def detokenize(self, request: Request):
        parsed = await parse_body(request, parse_detokenize)
        check_model(parsed.model, self.frontend.model_name)
        return await self.frontend.answer_once(request, new_id("tok"), DetokenizeJob(parsed.tokens))

    async def tokenizer_info(self, request: Request):
        return await self.frontend.answer_once(request, new_id("tok"), TokenizerInfoJob())
