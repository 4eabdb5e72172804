"""The request and response schemas of the routes, in the server's OpenAPI document (`/openapi.json`).

The routes parse their own bodies (appliance/protocol: errors that name the field), so FastAPI cannot
infer these. Each request schema is its pydantic model's own (`protocol.openai_models` for chat
completions and completions, `protocol.pooling.PoolingBody`, `protocol.tokenize` for `/tokenize` and
`/detokenize`), the models that also validate the bodies;
the answers are declared here. For clients, docs (`/docs`) and the schema-driven fuzz tests.
"""
from typing import Any, Dict

from appliance.protocol.openai_models import ChatCompletionRequest, CompletionRequest
from appliance.protocol.pooling import PoolingBody
from appliance.protocol.tokenize import DetokenizeBody, TokenizeChatBody, TokenizeCompletionBody

ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"}, "param": {"type": ["string", "null"]},
        "code": {"type": "integer"}}}}}
USAGE = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
         "properties": {k: {"type": "integer", "minimum": 0} for k in ("prompt_tokens", "completion_tokens",
                                                                       "total_tokens")}}
FINISH = {"enum": ["stop", "length", None]}
CHAT_COMPLETION = {"type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
                   "properties": {"object": {"enum": ["chat.completion"]}, "usage": USAGE, "choices": {
                       "type": "array", "minItems": 1, "items": {"type": "object", "required": ["message", "finish_reason"],
                                                                 "properties": {"finish_reason": FINISH}}}}}
TEXT_COMPLETION = {"type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
                   "properties": {"object": {"enum": ["text_completion"]}, "usage": USAGE, "choices": {
                       "type": "array", "minItems": 1, "items": {"type": "object", "required": ["text", "finish_reason"],
                                                                 "properties": {"finish_reason": FINISH}}}}}
POOLING_RESPONSE = {"type": "object", "required": ["request_id", "created_at", "data"], "properties": {
    "data": {"type": "object", "required": ["data_format", "data"]}}}
TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}}
TOKENIZE_RESPONSE = {"type": "object", "required": ["count", "max_model_len", "tokens"], "properties": {
    "count": {"type": "integer", "minimum": 0}, "max_model_len": {"type": "integer", "minimum": 1},
    "tokens": TOKEN_IDS, "token_strs": {"type": ["array", "null"], "items": {"type": "string"}}}}
DETOKENIZE_RESPONSE = {"type": "object", "required": ["prompt"], "properties": {"prompt": {"type": "string"}}}

SSE_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}  # a chunk or [DONE]
BODIES = {  # route -> (request model or models, answers by content type)
    "/v1/chat/completions": (ChatCompletionRequest, {"application/json": CHAT_COMPLETION,
                                                     "text/event-stream": SSE_EVENT}),
    "/v1/completions": (CompletionRequest, {"application/json": TEXT_COMPLETION, "text/event-stream": SSE_EVENT}),
    "/pooling": (PoolingBody, {"application/json": POOLING_RESPONSE}),
    "/tokenize": ((TokenizeCompletionBody, TokenizeChatBody), {"application/json": TOKENIZE_RESPONSE}),
    "/detokenize": (DetokenizeBody, {"application/json": DETOKENIZE_RESPONSE}),
}


def install(app) -> None:
    """Make `app.openapi()` describe our routes' bodies and answers (FastAPI caches the result)."""
    from fastapi.openapi.utils import get_openapi

    def openapi() -> Dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title="appliance", version="1", routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for path, item in schema.get("paths", {}).items():
                for method, operation in item.items():
                    _describe(path, method, operation, components)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi


def _describe(path: str, method: str, operation: Dict[str, Any], components: Dict[str, Any]) -> None:
    errors = {"description": "error", "content": {"application/json": {"schema": ERROR}}}
    operation["responses"] = {"4XX": errors, "5XX": errors, **{
        code: spec for code, spec in operation.get("responses", {}).items() if code == "200"}}
    if path in BODIES and method == "post":
        request, answers = BODIES[path]
        if isinstance(request, tuple):  # one of several request models (a text or a chat)
            schema = {"oneOf": [_model_schema(model, components) for model in request]}
        else:
            schema = _model_schema(request, components)
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
        operation["responses"]["200"] = {"description": "the answer", "content": {
            kind: {"schema": schema} for kind, schema in answers.items()}}
    elif path == "/v1/pool":
        operation["requestBody"] = {"required": True, "content": {"image/tiff": {"schema": {
            "type": "string", "format": "binary"}}}}
        operation["parameters"] = [{"name": "quicklook", "in": "query", "required": False,
                                    "schema": {"type": "boolean"}}]
        operation["responses"]["200"] = {"description": "the output GeoTIFF (or PNG quicklook)", "content": {
            "image/tiff": {"schema": {"type": "string", "format": "binary"}},
            "image/png": {"schema": {"type": "string", "format": "binary"}}}}


def _model_schema(model, components: Dict[str, Any]) -> Dict[str, Any]:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    components.update(schema.pop("$defs", {}))  # nested models, shared by the routes
    return schema
