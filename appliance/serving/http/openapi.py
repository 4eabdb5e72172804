"""The server's OpenAPI document (`/openapi.json`), every request and answer schema a pydantic model's own.

The routes parse their own bodies (appliance/protocol: errors that name the field) and answer plain
dicts (no model is built per request), and LitServe adds them with neither a body nor a response model,
so FastAPI can infer neither; `install` adds both to the document, once, from
the models that validate the requests (`protocol.openai_models`, `protocol.pooling.PoolingBody`,
`protocol.tokenize`) and the models that describe the answers (`protocol.openai_answers`, errors
included, `protocol.pooling.PoolingResponse`, `protocol.tokenize`'s `TokenizeResponse`,
`DetokenizeResponse`, `TokenizerInfoResponse`). An answer's model is a component
(`#/components/schemas/ChatCompletion`); a request's schema stays inline, its nested models components.
A streamed answer is `text/event-stream`, one schema per event (as OpenAPI 3.1 reads a stream): its
`data` is a chunk model's JSON (`contentSchema`), an error's, or `[DONE]`. `/v1/pool` takes and answers
GeoTIFF bytes, which no model describes. LitServe's own routes (`GET /`, its health and info) are left
out: the Gate answers them 404 (http/errors.py); so are the pages' files (appliance/serving/ui), which
are no API. For clients, the docs page (`/docs`) and the schema-driven fuzz tests.
"""
from typing import Any, Dict

from appliance.protocol.openai_answers import (ChatCompletion, ChatCompletionChunk, Completion, CompletionChunk,
                                               ErrorResponse, ModelCard, ModelList)
from appliance.protocol.openai_models import ChatCompletionRequest, CompletionRequest
from appliance.protocol.pooling import PoolingBody, PoolingResponse
from appliance.protocol.tokenize import (DetokenizeBody, DetokenizeResponse, TokenizeChatBody,
                                         TokenizeCompletionBody, TokenizerInfoResponse, TokenizeResponse)
from appliance.serving.http.errors import LITSERVE_ROUTES
from appliance.serving.ui.routes import PAGE_PATHS

JSON, SSE = "application/json", "text/event-stream"
REF = "#/components/schemas/{model}"
REQUESTS = {  # path -> the POST body's model, or the models one of which it is (a text or a chat)
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/pooling": PoolingBody,
    "/tokenize": (TokenizeCompletionBody, TokenizeChatBody),
    "/detokenize": DetokenizeBody,
}
ANSWERS = {  # (method, path) -> the 200 answer's model by content type (a stream: one event's data)
    ("post", "/v1/chat/completions"): {JSON: ChatCompletion, SSE: ChatCompletionChunk},
    ("post", "/v1/completions"): {JSON: Completion, SSE: CompletionChunk},
    ("post", "/pooling"): {JSON: PoolingResponse},
    ("post", "/tokenize"): {JSON: TokenizeResponse},
    ("post", "/detokenize"): {JSON: DetokenizeResponse},
    ("get", "/tokenizer_info"): {JSON: TokenizerInfoResponse},
    ("get", "/v1/models"): {JSON: ModelList},
    ("get", "/v1/models/{model_id}"): {JSON: ModelCard},
}
BYTES = {"type": "string", "format": "binary"}


def install(app) -> None:
    """Make `app.openapi()` describe our routes' bodies and answers (FastAPI caches the result)."""
    from fastapi.openapi.utils import get_openapi

    def openapi() -> Dict[str, Any]:
        if app.openapi_schema is None:
            served = [route for route in app.routes
                      if getattr(route, "path", None) not in LITSERVE_ROUTES + PAGE_PATHS]
            schema = get_openapi(title="appliance", version="1", routes=served)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for path, item in schema.get("paths", {}).items():
                for method, operation in item.items():
                    _describe(path, method, operation, components)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi


def _describe(path: str, method: str, operation: Dict[str, Any], components: Dict[str, Any]) -> None:
    errors = {"description": "an error (a stream that has started sends it as an event instead)",
              "content": {JSON: {"schema": _component(ErrorResponse, components)}}}
    operation["responses"] = {"4XX": errors, "5XX": errors, **{
        code: spec for code, spec in operation.get("responses", {}).items() if code == "200"}}
    if method == "post" and path in REQUESTS:
        request = REQUESTS[path]
        if isinstance(request, tuple):
            schema = {"oneOf": [_inline(model, components) for model in request]}
        else:
            schema = _inline(request, components)
        operation["requestBody"] = {"required": True, "content": {JSON: {"schema": schema}}}
    if (method, path) in ANSWERS:
        operation["responses"]["200"] = {"description": "the answer", "content": {
            kind: {"schema": _event(model, components) if kind == SSE else _component(model, components)}
            for kind, model in ANSWERS[method, path].items()}}
    elif path == "/v1/pool":
        operation["requestBody"] = {"required": True, "content": {"image/tiff": {"schema": BYTES}}}
        operation["parameters"] = [{"name": "quicklook", "in": "query", "required": False,
                                    "schema": {"type": "boolean"}}]
        operation["responses"]["200"] = {"description": "the output GeoTIFF (or PNG quicklook)", "content": {
            "image/tiff": {"schema": BYTES}, "image/png": {"schema": BYTES}}}


def _event(chunk, components: Dict[str, Any]) -> Dict[str, Any]:
    """One server-sent event of a stream of `chunk`s: unless it is the last, `[DONE]`, its data is JSON."""
    json_data = {"contentMediaType": JSON, "contentSchema": {"anyOf": [
        _component(chunk, components), _component(ErrorResponse, components)]}}
    return {"type": "object", "required": ["data"], "properties": {"data": {
        "type": "string", "if": {"const": "[DONE]"}, "else": json_data,
        "description": f"a {chunk.__name__} as JSON; an ErrorResponse if the answer fails once streaming; "
                       "[DONE] last"}}}


def _inline(model, components: Dict[str, Any]) -> Dict[str, Any]:
    """The model's own schema, its nested models as components."""
    schema = model.model_json_schema(ref_template=REF)
    _add(schema.pop("$defs", {}), components)
    return schema


def _component(model, components: Dict[str, Any]) -> Dict[str, Any]:
    """A reference to the model, made a component with the models it nests."""
    _add({model.__name__: _inline(model, components)}, components)
    return {"$ref": REF.format(model=model.__name__)}


def _add(schemas: Dict[str, Any], components: Dict[str, Any]) -> None:
    for name, schema in schemas.items():
        if components.setdefault(name, schema) != schema:
            raise ValueError(f"two models named {name} in the OpenAPI document: rename one")
