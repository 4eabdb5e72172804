"""Hostile HTTP input, hand-written and generated, on every inference route: each gets a 4xx whose
message names the problem (never a 5xx), and the server is healthy afterwards.

Servers: the shared `llava_server` (OpenAI routes; image URLs may name 127.0.0.1, fetches time out
after 2 s) and `flood_server` (/pooling and /v1/pool; API key; 127.0.0.1 allowed).
"""
import base64
import json
import socket

import httpx
import pytest

from tests.reliability import hostile_media as media
from tests.servers import API_KEY, error

AUTH = {"Authorization": f"Bearer {API_KEY}"}
HI = [{"role": "user", "content": "Hi"}]


def chat(**fields):
    return {"json": {"model": "llava-tiny", "messages": HI, "max_tokens": 2, **fields}}


def raw(content: bytes):
    return {"content": content, "headers": {"Content-Type": "application/json"}}


def image(url):
    return chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                       {"type": "text", "text": "What is it?"}]}])


def completion(**fields):
    return {"json": {"model": "llava-tiny", "prompt": "Hi", "max_tokens": 2, **fields}}


def pooling(data=None, **top):
    body = {"data": {"data": base64.b64encode(media.geotiff(32, 32)).decode(), "data_format": "b64_json",
                     "out_data_format": "b64_json", **(data or {})}, **top}
    return {"json": body, "headers": AUTH}


def scene_b64(content: bytes):
    return pooling({"data": base64.b64encode(content).decode()})


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# (id, route, request builder taking the hostile host's base URL, status, fragment the message must hold)
CHAT = "/v1/chat/completions"
HAND_WRITTEN = [
    ("malformed JSON", CHAT, lambda h: raw(b'{"messages": [{"role": "user"'), 400, "not valid JSON"),
    ("body is a list", CHAT, lambda h: raw(b"[1, 2]"), 400, "expected a JSON object"),
    ("body is a string", CHAT, lambda h: raw(b'"hello"'), 400, "expected a JSON object"),
    ("not UTF-8", CHAT, lambda h: raw(b"\xff\xfe{}"), 400, "body"),
    ("NaN literal", CHAT, lambda h: raw(b'{"messages": [{"role": "user", "content": "x"}], "top_p": NaN}'), 400,
     "NaN"),
    ("a number past float range", CHAT, lambda h: raw(b'{"messages": [{"role": "user", "content": "x"}], '
                                                      b'"temperature": 1e400}'), 400, "temperature"),
    ("Infinity literal", CHAT, lambda h: raw(b'{"messages": [], "temperature": Infinity}'), 400, "Infinity"),
    ("messages missing", CHAT, lambda h: {"json": {"model": "llava-tiny"}}, 400, "messages: required"),
    ("messages empty", CHAT, lambda h: chat(messages=[]), 400, "non-empty"),
    ("messages not a list", CHAT, lambda h: chat(messages="Hi"), 400, "messages"),
    ("message not an object", CHAT, lambda h: chat(messages=["Hi"]), 400, "messages[0]"),
    ("unknown role", CHAT, lambda h: chat(messages=[{"role": "robot", "content": "x"}]), 400, "messages[0].role"),
    ("tool message without its call id", CHAT, lambda h: chat(messages=[{"role": "tool", "content": "x"}]), 400,
     "messages[0].tool_call_id"),
    ("content a number", CHAT, lambda h: chat(messages=[{"role": "user", "content": 5}]), 400,
     "messages[0].content"),
    ("part type unknown", CHAT, lambda h: chat(messages=[{"role": "user", "content": [{"type": "audio"}]}]), 400,
     "messages[0].content[0].type"),
    ("image part without url", CHAT, lambda h: chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {}}]}]), 400, "image_url.url"),
    ("uncompilable schema", CHAT, lambda h: chat(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}}),
     400, "response_format"),
    ("unknown field", CHAT, lambda h: chat(functions=[]), 400, "functions"),
    ("unknown model", CHAT, lambda h: chat(model="gpt-5"), 404, "model"),
    ("model not a string", CHAT, lambda h: chat(model=5), 400, "model"),
    ("a 10 MB string", CHAT, lambda h: chat(messages=[{"role": "user", "content": "word " * 2_000_000}]), 400,
     "the prompt is"),
    ("a 10 MB completion prompt", "/v1/completions", lambda h: completion(prompt="word " * 2_000_000), 400,
     "the prompt is 10000000 characters"),
    ("prompt longer than the context", CHAT, lambda h: chat(messages=[{"role": "user", "content": "a b " * 300}]),
     400, "context is 256 tokens"),
    ("body over the limit", CHAT, lambda h: raw(b" " * (21 * 1024 * 1024)), 413, "max_request_bytes"),
    ("too many images", CHAT, lambda h: chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": media.data_url(media.png())}},
        {"type": "image_url", "image_url": {"url": media.data_url(media.png())}}]}]), 400, "2 images"),
    ("image URL unreachable", CHAT, lambda h: image(f"http://127.0.0.1:{closed_port()}/x.png"), 400, "127.0.0.1"),
    ("image URL too slow", CHAT, lambda h: image(f"{h}/slow.png"), 400, "took longer than"),
    ("redirect to a private address", CHAT, lambda h: image(f"{h}/private"), 400, "10.1.2.3"),
    ("redirect to cloud metadata", CHAT, lambda h: image(f"{h}/metadata"), 400, "169.254.169.254"),
    ("redirect loop", CHAT, lambda h: image(f"{h}/loop"), 400, "redirect"),
    ("image URL answers HTML", CHAT, lambda h: image(f"{h}/html"), 400, "not an image"),
    ("private address named directly", CHAT, lambda h: image("http://10.0.0.1/x.png"), 400, "10.0.0.1"),
    ("file URL", CHAT, lambda h: image("file:///etc/passwd"), 400, "image_url"),
    ("ftp URL", CHAT, lambda h: image("ftp://example.com/x.png"), 400, "scheme"),
    ("truncated PNG", CHAT, lambda h: image(media.data_url(media.png(64, 64)[:60])), 400, "truncated or corrupt"),
    ("decompression bomb", CHAT, lambda h: image(media.data_url(media.bomb_png())), 400, "400000000 pixels"),
    ("SVG", CHAT, lambda h: image(media.data_url(media.SVG, "image/svg+xml")), 400, "not an image"),
    ("animated GIF", CHAT, lambda h: image(media.data_url(media.animated_gif(), "image/gif")), 400, "animated GIF"),
    ("bad base64", CHAT, lambda h: image("data:image/png;base64,@@@not-base64@@@"), 400, "not valid base64"),
    ("data URL whose mime type lies", CHAT, lambda h: image(media.data_url(media.jpeg(), "image/png")), 400,
     "says image/png but the data is JPEG"),
    ("data URL not an image type", CHAT, lambda h: image("data:text/html;base64,PGI+aGk8L2I+"), 400,
     "mime type is 'text/html'"),
    ("typed image placeholder", CHAT, lambda h: chat(messages=[{"role": "user", "content": "<image> hi"}]), 400,
     "image placeholder"),
    # completions
    ("completion prompt missing", "/v1/completions", lambda h: {"json": {"max_tokens": 2}}, 400, "prompt: required"),
    ("completion empty prompt", "/v1/completions", lambda h: completion(prompt=""), 400, "prompt"),
    ("completion prompt list with a number", "/v1/completions", lambda h: completion(prompt=["a", 5]), 400,
     "prompt"),
    ("completion empty prompt list", "/v1/completions", lambda h: completion(prompt=[]), 400, "prompt"),
    ("completion n zero", "/v1/completions", lambda h: completion(n=0), 400, "allowed: >= 1"),
    ("completion negative token id", "/v1/completions", lambda h: completion(prompt=[1, -3]), 400, "prompt"),
    ("completion token id past the vocabulary", "/v1/completions", lambda h: completion(prompt=[1, 10 ** 9]), 400,
     "outside the vocabulary"),
    ("completion prompt an object", "/v1/completions", lambda h: completion(prompt={"text": "x"}), 400, "prompt"),
    ("completion echo not a bool", "/v1/completions", lambda h: completion(echo="yes"), 400, "echo"),
    ("completion image placeholder ids", "/v1/completions", lambda h: completion(prompt=[1, 427, 427]), 400,
     "image tokens"),
]

# Generated: every sampling field with values of the wrong type, sign or size, on both routes.
BAD_VALUES = {
    "temperature": [-1, "hot", [0.5]],
    "top_p": [0, -0.5, 1.5, "x"],
    "top_k": [-1, 1.5, "x"],
    "max_tokens": [0, -5, 2.5, "x", 10 ** 12],
    "min_tokens": [-1, 10 ** 6, "x"],
    "seed": [2 ** 70, 1.5, "x"],
    "stop": [5, [1, 2], [""]],
    "stop_token_ids": [[-1], "x", [1.5]],
    "ignore_eos": ["yes", 1],
    "n": [0, 129, "x", True],
    "stream": ["yes", 1],
    "logprobs": [-1, 99, "x"],
    "frequency_penalty": [0.5, False],
    "user": [5, ["x"]],
    "presence_penalty": [-1],
}
GENERATED = [(f"{route[4:]} {field}={value!r:.20}", route, (lambda h, f=field, v=value, b=builder: b(**{f: v})),
              400, field)
             for route, builder in (("/v1/chat/completions", chat), ("/v1/completions", completion))
             for field, values in BAD_VALUES.items() for value in values]
GENERATED += [
    ("chat logprobs not a bool", CHAT, lambda h: chat(logprobs=3), 400, "logprobs"),
    ("chat top_logprobs too many", CHAT, lambda h: chat(logprobs=True, top_logprobs=21), 400, "top_logprobs"),
    ("chat top_logprobs negative", CHAT, lambda h: chat(logprobs=True, top_logprobs=-1), 400, "top_logprobs"),
    ("completion logprobs too many", "/v1/completions", lambda h: completion(logprobs=21), 400, "logprobs"),
    ("completion logprobs a bool", "/v1/completions", lambda h: completion(logprobs=True), 400, "logprobs"),
    ("stream_options without stream", CHAT, lambda h: chat(stream_options={"include_usage": True}), 400,
     "stream_options"),
    ("stream_options unknown key", CHAT, lambda h: chat(stream=True, stream_options={"x": 1}), 400,
     "stream_options.x"),
]

POOL = [
    ("pooling malformed JSON", "/pooling",
     lambda h: {"content": b'{"data": ', "headers": {"Content-Type": "application/json", **AUTH}}, 400,
     "not valid JSON"),
    ("pooling data missing", "/pooling", lambda h: {"json": {}, "headers": AUTH}, 400, "data: required"),
    ("pooling data a string", "/pooling", lambda h: {"json": {"data": "x"}, "headers": AUTH}, 400, "data"),
    ("pooling unknown top field", "/pooling", lambda h: pooling(temperature=1), 400, "temperature"),
    ("pooling unknown data field", "/pooling", lambda h: pooling({"crs": "EPSG:4326"}), 400, "data.crs"),
    ("pooling data format unknown", "/pooling", lambda h: pooling({"data_format": "s3"}), 400, "data.data_format"),
    ("pooling out format unknown", "/pooling", lambda h: pooling({"out_data_format": "png"}), 400,
     "data.out_data_format"),
    ("pooling image format png", "/pooling", lambda h: pooling({"image_format": "png"}), 400, "data.image_format"),
    ("pooling empty data", "/pooling", lambda h: pooling({"data": ""}), 400, "data.data"),
    ("pooling data a number", "/pooling", lambda h: pooling({"data": 5}), 400, "data.data"),
    ("pooling bad indices", "/pooling", lambda h: pooling({"indices": [-1]}), 400, "data.indices"),
    ("pooling too few indices", "/pooling", lambda h: pooling({"indices": [0, 1]}), 400, "2 bands selected"),
    ("pooling priority", "/pooling", lambda h: pooling(priority=5), 400, "priority"),
    ("pooling task", "/pooling", lambda h: pooling(task="embed"), 400, "task"),
    ("pooling unknown model", "/pooling", lambda h: pooling(model="other"), 404, "model"),
    ("pooling bad base64", "/pooling", lambda h: pooling({"data": "%%%"}), 400, "base64"),
    ("pooling not a GeoTIFF", "/pooling", lambda h: scene_b64(b"hello, no tiff here"), 400, "GeoTIFF"),
    ("pooling a PNG", "/pooling", lambda h: scene_b64(media.png()), 400, "data.data"),
    ("pooling 0 bands", "/pooling", lambda h: scene_b64(media.tiff_header_only(0)), 400, "data.data"),
    ("pooling wrong band count", "/pooling", lambda h: scene_b64(media.geotiff(16, 16, bands=3)), 400,
     "the model expects 6"),
    ("pooling URL unreachable", "/pooling", lambda h: pooling({"data": f"http://127.0.0.1:{closed_port()}/s.tif",
                                                               "data_format": "url"}), 400, "data.data"),
    ("pooling URL private", "/pooling", lambda h: pooling({"data": f"{h}/private", "data_format": "url"}), 400,
     "10.1.2.3"),
    ("pooling URL slow", "/pooling", lambda h: pooling({"data": f"{h}/slow.png", "data_format": "url"}), 400,
     "took longer than"),
    ("pooling URL HTML", "/pooling", lambda h: pooling({"data": f"{h}/html", "data_format": "url"}), 400,
     "data.data"),
    ("pooling URL not http", "/pooling", lambda h: pooling({"data": "file:///etc/passwd", "data_format": "url"}),
     400, "http(s) URL"),
    ("pooling path outside", "/pooling", lambda h: pooling({"data": "../../etc/passwd", "data_format": "path"}),
     400, "outside"),
    ("pooling path missing", "/pooling", lambda h: pooling({"data": "nope.tif", "data_format": "path"}), 400,
     "not a file"),
    ("raw wrong content type", "/v1/pool",
     lambda h: {"content": b"x", "headers": {**AUTH, "Content-Type": "text/plain"}},
     415, "image/tiff"),
    ("raw empty body", "/v1/pool", lambda h: {"content": b"", "headers": {**AUTH, "Content-Type": "image/tiff"}}, 400,
     "empty"),
    ("raw not a GeoTIFF", "/v1/pool",
     lambda h: {"content": media.HTML, "headers": {**AUTH, "Content-Type": "image/tiff"}},
     400, "body"),
    ("raw bad quicklook", "/v1/pool?quicklook=maybe", lambda h: {"content": media.geotiff(16, 16),
                                                                "headers": {**AUTH, "Content-Type": "image/tiff"}},
     400, "quicklook"),
    ("raw over the limit", "/v1/pool", lambda h: {"content": b"\0" * (21 * 1024 * 1024),
                                                  "headers": {**AUTH, "Content-Type": "image/tiff"}}, 413,
     "max_request_bytes"),
    ("raw without the key", "/v1/pool", lambda h: {"content": media.geotiff(16, 16),
                                                   "headers": {"Content-Type": "image/tiff"}}, 401, "API key"),
]

CASES = HAND_WRITTEN + GENERATED + POOL


def test_the_table_is_big_enough():
    assert len(CASES) >= 60 and len({c[0] for c in CASES}) == len(CASES)


@pytest.fixture(scope="module")
def host():
    server = media.HostileHost()
    yield server.base
    server.close()


@pytest.mark.parametrize("label,route,build,status,fragment", CASES, ids=[c[0] for c in CASES])
def test_hostile_request_gets_a_4xx_naming_the_problem(request, host, label, route, build, status, fragment):
    server = request.getfixturevalue("flood_server" if route.startswith(("/pooling", "/v1/pool"))
                                     else "llava_server")
    response = httpx.post(f"{server.base}{route}", timeout=60, **build(host))
    assert response.status_code == status, (response.status_code, response.text[:500])
    err = error(response)
    assert fragment in err["message"] or fragment == err["param"], err
    assert "Traceback" not in err["message"] and "spool" not in err["message"]
    assert httpx.get(f"{server.base}/health", timeout=10).status_code == 200


def test_a_one_pixel_scene_is_served_as_appliance_run_writes_it(flood_server, tmp_path):
    """Not hostile after all: a 1x1 GeoTIFF is a valid scene (padded into one tile), answered 200."""
    import rasterio

    response = httpx.post(f"{flood_server.base}/pooling", timeout=60,
                          **scene_b64(media.geotiff(1, 1)))
    assert response.status_code == 200, response.text
    (tmp_path / "m.tif").write_bytes(base64.b64decode(response.json()["data"]["data"]))
    with rasterio.open(tmp_path / "m.tif") as ds:
        assert ds.shape == (1, 1) and ds.read(1)[0, 0] in (0, 1)
    assert json.loads(httpx.get(f"{flood_server.base}/health", timeout=10).text) == {"status": "ok"}
