"""`/openapi.json` lists only routes the server answers: every path and method in it, asked with an empty
body, gets anything but the 404 of an unknown route (a 400 for a body that is not valid, a 415 for the
wrong type, a 404 naming its path parameter for a scene that does not exist), on both kinds of server; a
method a path does not take is a 405 whose `Allow` lists every method of the path."""
import http.client
import re

import httpx
import pytest

from appliance.serving.http.route_table import GEOTIFF_TYPES
from tests.servers import API_KEY, error

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def assert_every_documented_route_answers(base: str, headers: dict) -> set:
    document = httpx.get(f"{base}/openapi.json", timeout=10).json()
    model = httpx.get(f"{base}/v1/models", headers=headers, timeout=10).json()["data"][0]["id"]
    asked = set()
    for path, item in document["paths"].items():
        url = base + re.sub(r"\{[^}]+\}", model, path)  # a model; for /v1/scenes an unknown scene
        for method in item:
            answer = httpx.request(method.upper(), url, json={}, headers=headers, timeout=60)
            unknown_route = answer.status_code == 404 and answer.json()["error"]["param"] is None
            assert not unknown_route, (method, path, answer.text)
            asked.add((method, path))
    return asked


def test_every_route_in_the_chat_servers_document_answers(llava_server):
    asked = assert_every_documented_route_answers(llava_server.base, {})
    assert {("post", "/v1/chat/completions"), ("get", "/v1/models/{model_id}"), ("get", "/health")} <= asked
    assert not {path for _, path in asked} & {"/", "/litserve/health", "/litserve/info"}


def test_every_route_in_the_flood_servers_document_answers(flood_server):
    asked = assert_every_documented_route_answers(flood_server.base, AUTH)
    assert {("post", "/pooling"), ("post", "/v1/pool"), ("get", "/metrics"), ("post", "/v1/scenes"),
            ("delete", "/v1/scenes/{id}"), ("get", "/v1/scenes/{id}/{file}")} <= asked
    assert not {path for _, path in asked} & {"/", "/litserve/health", "/litserve/info"}



def test_the_raw_pool_route_is_documented_as_bytes(flood_server):
    operation = httpx.get(f"{flood_server.base}/openapi.json", timeout=10).json()["paths"]["/v1/pool"]["post"]
    binary = {"type": "string", "format": "binary"}
    assert operation["requestBody"]["content"] == {kind: {"schema": binary} for kind in GEOTIFF_TYPES}
    assert [(p["name"], p["in"], p["required"], p["schema"]["type"]) for p in operation["parameters"]] == [
        ("quicklook", "query", False, "boolean"), ("date", "query", False, "string")]
    assert set(operation["responses"]["200"]["content"]) == {"image/tiff", "image/png"}


@pytest.mark.parametrize("method, path, allow", [
    ("OPTIONS", "/v1/scenes", "GET, POST"),  # Starlette alone: "POST", the first route's
    ("PUT", "/v1/scenes", "GET, POST"),
    ("POST", "/v1/scenes/scene-x", "DELETE, GET"),
    ("DELETE", "/v1/models/flood", "GET"),
    ("POST", "/", "GET, HEAD"),  # the page: LitServe's own `GET /` is behind it
    ("POST", "/index.html", "GET, HEAD"),  # a path only the page layer serves
    ("DELETE", "/docs", "GET, HEAD"),
])
def test_a_405_lists_every_method_of_its_path(flood_server, method, path, allow):
    answer = httpx.request(method, f"{flood_server.base}{path}", headers=AUTH, timeout=10)
    assert answer.status_code == 405 and answer.headers["allow"] == allow, answer.text
    assert error(answer)["message"] == f"{method} {path}: method not allowed; allowed: {allow}"


def declared_length(base: str, method: str, path: str, length: int) -> int:
    """The status of a request that declares a body of `length` bytes and sends none (a 413 comes first)."""
    url = httpx.URL(base)
    connection = http.client.HTTPConnection(url.host, url.port, timeout=30)
    try:
        connection.putrequest(method, path)
        connection.putheader("Authorization", f"Bearer {API_KEY}")
        connection.putheader("Content-Length", str(length))
        connection.endheaders()
        return connection.getresponse().status
    finally:
        connection.close()


# (method, path as asked, how): a request each error status of the route answers
PROVOKED = [
    ("GET", "/v1/scenes", "no key", 401),
    ("POST", "/pooling", "text", 415),
    ("POST", "/v1/pool", "text", 415),
    ("POST", "/pooling", "empty object", 400),
    ("POST", "/pooling", "other model", 404),
    ("GET", "/v1/scenes/scene-x", "", 404),
    ("DELETE", "/v1/scenes/scene-x", "", 404),
    ("GET", "/v1/scenes/scene-x/mask.tif", "", 404),
    ("GET", "/v1/models/other", "", 404),
    ("POST", "/v1/scenes", "too large", 413),
    ("POST", "/pooling", "too large", 413),
]


@pytest.mark.parametrize("method, path, how, status", PROVOKED)
def test_the_document_lists_each_status_a_route_answers(flood_server, method, path, how, status):
    """The server answers `status`, and the document lists it for that operation, with the error's schema."""
    base, headers, body = flood_server.base, {} if how == "no key" else AUTH, None
    if how == "too large":
        answered = declared_length(base, method, path, 10 ** 12)
    else:
        content = {"text": {"content": b"{}", "headers": {**headers, "Content-Type": "text/plain"}},
                   "empty object": {"json": {}, "headers": headers},
                   "other model": {"json": {"model": "other", "data": {"data": "x", "data_format": "path"}},
                                   "headers": headers}}.get(how, {"headers": headers})
        answer = httpx.request(method, base + path, timeout=30, **content)
        answered, body = answer.status_code, answer
    assert answered == status, body.text if body is not None else answered
    document = httpx.get(f"{base}/openapi.json", timeout=10).json()
    operation = next(item[method.lower()] for documented, item in document["paths"].items()
                     if re.fullmatch(re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(documented)), path))
    assert operation["responses"][str(status)]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorResponse"}


def test_every_route_documents_the_statuses_it_can_answer(flood_server):
    """A body route: 400, 413, 415; a keyed one: 401; a path parameter: 404; a queued one: 429, 500, 503, 504;
    the probes' 503 is their own answer, not an error; no status range stands in for a list."""
    document = httpx.get(f"{flood_server.base}/openapi.json", timeout=10).json()
    for path, item in document["paths"].items():
        for method, operation in item.items():
            statuses = set(operation["responses"])
            assert not {"4XX", "5XX", "default"} & statuses, (method, path)
            if "requestBody" in operation:
                assert {"400", "413", "415"} <= statuses, (method, path)
            if operation.get("security"):
                assert "401" in statuses, (method, path)
            if "{" in path:
                assert "404" in statuses, (method, path)
    pooling = set(document["paths"]["/pooling"]["post"]["responses"])
    assert pooling == {"200", "400", "401", "404", "413", "415", "429", "500", "503", "504"}
    for probe in ("/health", "/ready"):
        responses = document["paths"][probe]["get"]["responses"]
        assert set(responses) == {"200", "503"}
        assert responses["503"]["content"] == responses["200"]["content"], probe
    assert set(document["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
