"""`/openapi.json` lists only routes the server answers: every path and method in it, asked with an empty
body, gets anything but the 404 of an unknown route (a 400 for a body that is not valid, a 415 for the
wrong type, a 404 naming its path parameter for a scene that does not exist), on both kinds of server."""
import re

import httpx

from tests.servers import API_KEY

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
    assert operation["requestBody"]["content"] == {"image/tiff": {"schema": binary}}
    assert [(p["name"], p["in"], p["required"], p["schema"]["type"]) for p in operation["parameters"]] == [
        ("quicklook", "query", False, "boolean"), ("date", "query", False, "string")]
    assert set(operation["responses"]["200"]["content"]) == {"image/tiff", "image/png"}
