"""The request and response schemas of the routes, in the server's OpenAPI document (`/openapi.json`).

The routes parse their own bodies (appliance/protocol: errors that name the field), so FastAPI cannot
infer these. `/pooling`'s, `/tokenize`'s and `/detokenize`'s requests are their pydantic models' own
schemas (`protocol.pooling`, `protocol.tokenize`: the models that also validate the bodies); the chat
and completion requests are still declared here beside their hand-written parser, as are the
answers. For clients, docs (`/docs`) and the schema-driven fuzz tests.
"""
from typing import Any, Dict

from pydantic import BaseModel

from appliance.protocol.pooling import PoolingBody
from appliance.protocol.tokenize import DetokenizeBody, TokenizeChatBody, TokenizeCompletionBody

STRING_OR_LIST = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}, {"type": "null"}]}
NULLABLE_BOOL = {"type": ["boolean", "null"]}
MAX_TOKENS = {"type": ["integer", "null"], "minimum": 1}  # the context bounds it: past it, a 400 that says so
# Fields OpenAI clients send that the parser accepts only at their neutral value (protocol.NEUTRAL_FIELDS).
NEUTRAL = {"frequency_penalty": {"type": "number", "enum": [0]}, "presence_penalty": {"type": "number", "enum": [0]}}
SAMPLING = {
    "model": {"type": ["string", "null"]},
    "max_tokens": MAX_TOKENS,
    "max_completion_tokens": MAX_TOKENS,
    "temperature": {"type": ["number", "null"], "minimum": 0},  # as vLLM: no upper bound (OpenAI: 2)
    "top_p": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1},
    "top_k": {"type": ["integer", "null"], "minimum": 0},
    "seed": {"type": ["integer", "null"], "minimum": -(2 ** 63), "maximum": 2 ** 63 - 1},
    "min_tokens": {"type": ["integer", "null"], "minimum": 0},
    "stop": STRING_OR_LIST,
    "stop_token_ids": {"type": ["array", "null"], "items": {"type": "integer", "minimum": 0}},
    "ignore_eos": NULLABLE_BOOL,
    "stream": NULLABLE_BOOL,
    "stream_options": {"type": ["object", "null"], "additionalProperties": False,
                       "properties": {"include_usage": NULLABLE_BOOL, "continuous_usage_stats": NULLABLE_BOOL}},
    "n": {"type": ["integer", "null"], "enum": [1, None]},
    "user": {"type": ["string", "null"]},
    "logit_bias": {"type": ["object", "null"], "propertyNames": {"pattern": "^[0-9]+$"},
                   "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}},
    "response_format": {"type": ["object", "null"], "required": ["type"], "properties": {
        "type": {"enum": ["text", "json_object", "json_schema"]}, "json_schema": {"type": "object"}}},
    "structured_outputs": {"type": ["object", "null"]},  # vLLM's: one of json, regex, choice, grammar
    **NEUTRAL,
}
PART = {"oneOf": [
    {"type": "object", "required": ["type", "text"], "additionalProperties": False,
     "properties": {"type": {"enum": ["text"]}, "text": {"type": "string"}}},
    {"type": "object", "required": ["type", "image_url"], "additionalProperties": False,
     "properties": {"type": {"enum": ["image_url"]},
                    "image_url": {"type": "object", "required": ["url"], "properties": {"url": {"type": "string"}}}}},
]}
MESSAGE = {"type": "object", "required": ["role", "content"], "additionalProperties": False,
           "properties": {"role": {"enum": ["system", "developer", "user", "assistant"]}, "name": {"type": "string"},
                          "content": {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": PART}]}}}
CHAT_REQUEST = {"type": "object", "required": ["messages"], "additionalProperties": False, "properties": {
    **SAMPLING, "messages": {"type": "array", "minItems": 1, "items": MESSAGE},
    "logprobs": NULLABLE_BOOL, "top_logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": 20}}}
TEXT_PROMPT = {"type": "string", "minLength": 1}
TOKEN_PROMPT = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}
COMPLETION_REQUEST = {"type": "object", "required": ["prompt"], "additionalProperties": False, "properties": {
    **SAMPLING, "prompt": {"oneOf": [TEXT_PROMPT, TOKEN_PROMPT,  # one prompt, or a batch of exactly one
                                     {"type": "array", "minItems": 1, "maxItems": 1, "items": TEXT_PROMPT},
                                     {"type": "array", "minItems": 1, "maxItems": 1, "items": TOKEN_PROMPT}]},
    "logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": 20},
    "echo": {"enum": [False]}, "best_of": {"type": "integer", "enum": [1]},
    "suffix": {"type": ["string", "null"], "maxLength": 0}}}
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
BODIES = {
    "/v1/chat/completions": (CHAT_REQUEST, {"application/json": CHAT_COMPLETION, "text/event-stream": SSE_EVENT}),
    "/v1/completions": (COMPLETION_REQUEST, {"application/json": TEXT_COMPLETION, "text/event-stream": SSE_EVENT}),
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
            request = {"oneOf": [_model_schema(model, components) for model in request]}
        elif isinstance(request, type) and issubclass(request, BaseModel):  # a request model: its own schema
            request = _model_schema(request, components)
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": request}}}
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
    """A pydantic model's JSON schema; the models it nests go to the document's components."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    components.update(schema.pop("$defs", {}))
    return schema
