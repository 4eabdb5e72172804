"""Real `appliance serve` processes shared by the serving and reliability tests (a pytest plugin loaded by
tests/conftest.py), started once per session when a test asks for one, and stopped after.

- `llava_server`: `pipeline=llava_chat` with the embedded tiny LLaVA: OpenAI routes; image URLs may name
  127.0.0.1 (the tests' own image hosts), fetches time out after 2 s.
- `flood_server`: `pipeline=prithvi_flood` with the embedded demo flood model served as `flood`, an API
  key (from $APPLIANCE_API_KEY), an allowed media directory and an output directory: `/pooling`, `/v1/pool`.
"""
import base64
import io
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO
from tests.server_process import server_process

SAMPLE_IMAGE = REPO / "appliance" / "assets" / "samples" / "orange_star.png"
SAMPLE_SCENE = REPO / "appliance" / "assets" / "samples" / "flood_sample.tif"
LLAVA_TINY = REPO / "appliance" / "assets" / "models" / "llava_tiny"
API_KEY = "test-key-123"
FETCH_TIMEOUT_S = 2


@pytest.fixture(scope="session")
def llava_server(tmp_path_factory):
    if not (LLAVA_TINY / "config.json").is_file():
        pytest.skip("appliance/assets/models/llava_tiny is missing")
    with server_process("pipeline=llava_chat", "server.allowed_media_domains=[127.0.0.1]",
                        f"server.limits.fetch_timeout_s={FETCH_TIMEOUT_S}",
                        cwd=tmp_path_factory.mktemp("llava_serve")) as server:
        yield server


@pytest.fixture(scope="session")
def flood_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("flood_serve")
    dirs = {name: root / name for name in ("media", "outputs", "cwd", "spool")}
    for path in dirs.values():
        path.mkdir()
    (dirs["media"] / "scene.tif").write_bytes(SAMPLE_SCENE.read_bytes())
    return dirs


@pytest.fixture(scope="session")
def flood_server(flood_dirs):
    with server_process("pipeline=prithvi_flood", "server.served_model_name=flood",
                        f"server.allowed_local_media_dir={flood_dirs['media']}",
                        f"server.output_dir={flood_dirs['outputs']}", "server.allowed_media_domains=[127.0.0.1]",
                        f"server.limits.fetch_timeout_s={FETCH_TIMEOUT_S}", f"server.spool_dir={flood_dirs['spool']}",
                        cwd=flood_dirs["cwd"], env={"APPLIANCE_API_KEY": API_KEY}) as server:
        yield server


def data_url(path=SAMPLE_IMAGE) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def png_data_url(image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def image_question(url: str, text: str = "What color is the shape?"):
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": text}]}]


def metrics(base: str) -> dict:
    """{(name, labels without model_name): value} of every sample /metrics exports."""
    text = httpx.get(f"{base}/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "model_name"))
            out[(sample.name, labels)] = sample.value
    return out


def error(response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["code"] == response.status_code
    return body["error"]


def wait_for_metric(base: str, name: str, value: float, timeout: float = 120.0) -> None:
    """Until the unlabelled metric `name` reads `value` (fails after `timeout` s)."""
    deadline = time.monotonic() + timeout
    while metrics(base)[(name, ())] != value:
        assert time.monotonic() < deadline, f"{name} never reached {value}"
        time.sleep(0.05)


def wait_idle(base: str, timeout: float = 120.0):
    """Until nothing runs, waits or holds a KV block; the last metrics read."""
    deadline = time.monotonic() + timeout
    while True:
        now = metrics(base)
        idle = (now[("appliance_num_requests_running", ())], now[("appliance_num_requests_waiting", ())],
                now.get(("appliance_kv_cache_usage_perc", ()), 0)) == (0, 0, 0)  # a pool server has no KV
        if idle or time.monotonic() > deadline:
            return now
        time.sleep(0.1)
