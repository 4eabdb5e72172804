"""`/openapi.json` lists only routes the server answers: every path and method in it, asked with an empty
body, gets anything but the 404 of an unknown route (a 400 for a body that is not valid, a 415 for the
wrong type, a 404 naming its path parameter for a scene that does not exist), on both kinds of server; a
method a path does not take is a 405 whose `Allow` lists every method of the path."""
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
