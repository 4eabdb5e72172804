"""The server's OpenAPI document (`/openapi.json`), every request and answer schema a pydantic model's own.

The routes parse their own bodies (appliance/protocol: errors that name the field) and answer plain
dicts (no model is built per request), and LitServe adds them with neither a body nor a response model,
so FastAPI can infer neither; `install` adds both to the document, once, from the route table
(route_table.py's `Route`s: the models that validate each body and describe each answer). An answer's
model is a component (`#/components/schemas/ChatCompletion`; the table names it by `Ref`, imported here);
a request's schema stays inline, its nested models components. A streamed answer is `text/event-stream`,
one schema per event (as OpenAPI 3.1 reads a stream): its `data` is a chunk model's JSON
(`contentSchema`), an error's, or `[DONE]`. Bytes (a GeoTIFF, a PNG) are binary strings. Path parameters
(`{id}`) are declared here, since the handlers take them from the request. Each operation lists the
statuses it can answer (`Route.statuses`: the route table's facts, never a `4XX` range), each error an
`ErrorResponse`, but a probe's 503, which is its own answer. Only the table's documented
routes are listed: not LitServe's own (`GET /`, its health and info: the Gate answers them 404), nor the
pages' files, which are no API, nor the document itself.
The server is named relative to the document (`servers: [{"url": "."}]`), so behind a proxy's path prefix
a client reading the document, the docs page's "Try it out" among them, calls the same server. A server
with an API key declares it as a bearer scheme, required by the routes the table marks `auth` (the open
ones stay open); one without declares none, since none is asked for.
For clients, the docs page (`/docs`: Swagger UI, whose Authorize takes the key) and the schema-driven fuzz
tests.
"""
import re
from typing import Any, Dict, Iterable

from appliance.protocol.openai_answers import ErrorResponse
from appliance.serving.http.route_table import JSON, SSE, Route, resolved

REF = "#/components/schemas/{model}"
BEARER = {"bearer": {"type": "http", "scheme": "bearer", "description":
                     "the server's API key (server.api_key); also accepted as an X-API-Key header"}}


def install(app, routes: Iterable[Route], keyed: bool) -> None:
    """Make `app.openapi()` describe the documented `routes` (FastAPI caches the result); `keyed`: the
    server has an API key."""
    from fastapi.openapi.utils import get_openapi

    documented = {(route.openapi_path, method.lower()): route
                  for route in routes if route.documented for method in route.methods}
    paths = {route.path for route in documented.values()}

    def openapi() -> Dict[str, Any]:
        if app.openapi_schema is None:
            served = [route for route in app.routes if getattr(route, "path", None) in paths]
            schema = get_openapi(title="appliance", version="1", routes=served, servers=[{"url": "."}])
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for path, item in schema.get("paths", {}).items():
                for method, operation in item.items():
                    route = documented[path, method]
                    _describe(resolved(route), operation, components, keyed)
                    if keyed and route.auth:
                        operation["security"] = [{name: []} for name in BEARER]
            if keyed:
                schema["components"]["securitySchemes"] = BEARER
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi


def _describe(route: Route, operation: Dict[str, Any], components: Dict[str, Any], keyed: bool) -> None:
    errors = {"description": "an error (a stream that has started sends it as an event instead)",
              "content": {JSON: {"schema": _component(ErrorResponse, components)}}}
    operation["summary"] = route.help  # FastAPI's is the handler's name ("Partial"); the table's line says more
    success = operation.get("responses", {}).get("200")  # FastAPI's default success, under the route's status
    operation["responses"] = {str(status): errors for status in route.statuses(keyed)}
    if success is not None:
        operation["responses"][route.status] = success
    parameters = [{"name": name, "in": "path", "required": True, "schema": route.params.get(name, {"type": "string"})}
                  for name in re.findall(r"\{(\w+)\}", route.openapi_path)]
    parameters += [{"name": name, "in": "query", "required": False, "schema": schema}
                   for name, schema in route.query.items()]
    if parameters:
        operation["parameters"] = parameters
    if route.body:
        operation["requestBody"] = {"required": True, "content": {
            kind: {"schema": _body(schema, components)} for kind, schema in route.body.items()}}
    if route.answers:
        operation["responses"][route.status] = {"description": "the answer", "content": {
            kind: {"schema": _event(schema, components) if kind == SSE else _answer(schema, components)}
            for kind, schema in route.answers.items()}}
    if route.headers:
        operation["responses"][route.status]["headers"] = {
            name: {"description": text, "schema": {"type": "string"}} for name, text in route.headers.items()}
    for status in route.alike:  # a probe's 503: its answer, not an error
        operation["responses"][str(status)] = {**operation["responses"][route.status],
                                                "description": "the same answer, saying why not"}


def _body(schema, components: Dict[str, Any]) -> Dict[str, Any]:
    """A body's schema: inline (its nested models as components); one of several models; or as given."""
    if isinstance(schema, dict):
        return schema
    if isinstance(schema, tuple):
        return {"oneOf": [_inline(model, components) for model in schema]}
    return _inline(schema, components)


def _answer(schema, components: Dict[str, Any]) -> Dict[str, Any]:
    return schema if isinstance(schema, dict) else _component(schema, components)


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
