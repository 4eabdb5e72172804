"""What a page of another origin can make a browser send gets nothing: a JSON route answers 415 to the
bodies a browser sends cross-site without a preflight (text/plain, a form, multipart, no type), the
GeoTIFF routes take only their documented types, and without `server.cors_origins` no answer allows
another origin; with it, that origin only, preflights answered."""
import httpx
import pytest

from appliance.serving.http.route_table import served
from tests.conftest import FRAME_CONF
from tests.server_process import server_process
from tests.servers import API_KEY, error

AUTH = {"Authorization": f"Bearer {API_KEY}"}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
# The types a browser sends to another origin without asking it first (a CORS "simple request").
SIMPLE_TYPES = ["text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                "multipart/form-data; boundary=x", None]
APP, OTHER = "https://app.example.com", "https://other.example.com"


def post(base: str, path: str, kind, headers=None, body: bytes = b'{"prompt": "hi"}'):
    sent = {**(headers or {}), **({"Content-Type": kind} if kind else {})}
    return httpx.post(f"{base}{path}", content=body, headers=sent, timeout=30)


@pytest.mark.parametrize("kind", SIMPLE_TYPES)
def test_every_json_route_of_a_chat_server_refuses_a_simple_body(llava_server, kind):
    json_routes = [route.path for route in served("generate", ui=True) if route.json_only]
    assert {"/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"} <= set(json_routes)
    for path in json_routes:
        answer = post(llava_server.base, path, kind)
        assert answer.status_code == 415, (path, answer.text)
        named = kind.split(";")[0] if kind else "missing"
        assert error(answer)["param"] == "Content-Type"
        assert error(answer)["message"] == f"Content-Type: {named}; POST {path} takes application/json"


def test_a_json_body_with_a_charset_is_json(llava_server):
    answer = post(llava_server.base, "/tokenize", "application/json; charset=utf-8")
    assert answer.status_code == 200 and answer.json()["count"] > 0


@pytest.mark.parametrize("path, kind", [
    ("/pooling", "text/plain"), ("/pooling", None),
    ("/v1/pool", "text/plain"), ("/v1/pool", "application/x-www-form-urlencoded"), ("/v1/pool", None),
    ("/v1/scenes", "text/plain"), ("/v1/scenes", "application/x-www-form-urlencoded"), ("/v1/scenes", None),
])
def test_the_pool_servers_routes_take_only_their_documented_types(flood_server, path, kind):
    answer = post(flood_server.base, path, kind, AUTH)
    assert answer.status_code == 415, answer.text
    assert f"Content-Type: {kind or 'missing'};" in error(answer)["message"]


def test_a_one_date_server_refuses_a_form_to_its_scenes(flood_server):
    answer = post(flood_server.base, "/v1/scenes", "multipart/form-data; boundary=x", AUTH)
    assert answer.status_code == 400 and error(answer)["param"] == "body"


def test_without_cors_origins_no_answer_allows_another_origin(llava_server):
    asked = httpx.post(f"{llava_server.base}/v1/chat/completions", json=CHAT, headers={"Origin": OTHER}, timeout=60)
    assert asked.status_code == 200 and "access-control-allow-origin" not in asked.headers
    preflight = httpx.options(f"{llava_server.base}/v1/chat/completions", timeout=10, headers={
        "Origin": OTHER, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
    assert preflight.status_code == 405 and not [h for h in preflight.headers if h.startswith("access-control-")]


@pytest.fixture(scope="module")
def cors_server(tmp_path_factory):
    with server_process(f"server.cors_origins=[{APP}]", cwd=tmp_path_factory.mktemp("cors"),
                        conf_dir=FRAME_CONF) as server:
        yield server


@pytest.mark.slow  # a server of its own
def test_with_cors_origins_only_those_origins_are_allowed(cors_server):
    base = cors_server.base
    mine = httpx.get(f"{base}/version", headers={"Origin": APP}, timeout=10)
    assert mine.status_code == 200 and mine.headers["access-control-allow-origin"] == APP
    assert "Origin" in mine.headers["vary"]
    other = httpx.get(f"{base}/version", headers={"Origin": OTHER}, timeout=10)
    assert other.status_code == 200 and "access-control-allow-origin" not in other.headers
    refused = post(base, "/predict", "text/plain", {"Origin": APP})  # a refusal is readable by the page too
    assert refused.status_code == 415 and refused.headers["access-control-allow-origin"] == APP


@pytest.mark.slow
def test_with_cors_origins_a_preflight_is_answered_for_those_origins_only(cors_server):
    asks = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}
    mine = httpx.options(f"{cors_server.base}/predict", headers={"Origin": APP, **asks}, timeout=10)
    assert mine.status_code == 200 and mine.headers["access-control-allow-origin"] == APP
    assert "POST" in mine.headers["access-control-allow-methods"]
    assert {"authorization", "content-type"} <= {h.strip().lower() for h in
                                                mine.headers["access-control-allow-headers"].split(",")}
    other = httpx.options(f"{cors_server.base}/predict", headers={"Origin": OTHER, **asks}, timeout=10)
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    plain = httpx.options(f"{cors_server.base}/predict", timeout=10)  # no preflight: the route's 405
    assert plain.status_code == 405 and plain.headers["allow"] == "POST"
