"""`appliance serve pipeline=prithvi_flood`: vLLM's `/pooling` body and the raw `/v1/pool`, with httpx.

Every output must equal what `appliance run` writes for the same scene: pixels, CRS, transform, nodata.
"""
import base64
import concurrent.futures
import time

import httpx
import numpy as np
import pystac
import pytest
import rasterio

from tests.conftest import run_cli
from tests.geo.hls import RangeServer
from tests.servers import API_KEY, SAMPLE_SCENE, error, metrics

AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def offline_mask(tmp_path_factory):
    out = tmp_path_factory.mktemp("offline") / "mask.tif"
    result = run_cli("run", "pipeline=prithvi_flood", f"input={SAMPLE_SCENE}", f"output={out}")
    assert result.returncode == 0, result.stderr
    return out


def read(path):
    with rasterio.open(path) as ds:
        return ds.read(), ds.crs, ds.transform, ds.nodata, ds.dtypes


def assert_same_mask(path, offline_mask):
    got, expected = read(path), read(offline_mask)
    assert np.array_equal(got[0], expected[0])
    assert got[1:] == expected[1:]


def pooling(server, data, data_format="b64_json", out="b64_json", **extra):
    body = {"model": "flood", "data": {"data": data, "data_format": data_format,
                                                     "out_data_format": out, "image_format": "tiff"}, **extra}
    return httpx.post(f"{server.base}/pooling", json=body, headers=AUTH, timeout=120)


def scene_b64() -> str:
    return base64.b64encode(SAMPLE_SCENE.read_bytes()).decode()


def test_pooling_base64_round_trip_equals_appliance_run(flood_server, offline_mask, tmp_path):
    response = pooling(flood_server, scene_b64())
    assert response.status_code == 200, response.text
    # httpx asks for gzip; the server answers uncompressed (no gzip on the event loop: docs/serving.md)
    assert "content-encoding" not in response.headers
    body = response.json()
    assert set(body) == {"request_id", "created_at", "data"}
    assert body["data"]["data_format"] == "b64_json" and body["data"]["request_id"] == body["request_id"]
    (tmp_path / "out.tif").write_bytes(base64.b64decode(body["data"]["data"]))
    assert_same_mask(tmp_path / "out.tif", offline_mask)


def test_pooling_path_in_path_out(flood_server, flood_dirs, offline_mask):
    response = pooling(flood_server, "scene.tif", data_format="path", out="path")
    assert response.status_code == 200, response.text
    path = response.json()["data"]["data"]
    assert path.startswith(str(flood_dirs["outputs"])) and path.endswith(".tif")
    assert_same_mask(path, offline_mask)


def test_a_mask_names_its_source_as_the_client_sent_it(flood_server, flood_dirs):
    """The GeoTIFF `source` tag and the STAC item name the file the client named, or `upload` for bytes it
    sent: never the server's spool file, and no `derived_from` link to a file that is gone."""
    for data, data_format, source in [(scene_b64(), "b64_json", "upload"), ("scene.tif", "path", "scene.tif")]:
        response = pooling(flood_server, data, data_format=data_format, out="path")
        assert response.status_code == 200, response.text
        path = response.json()["data"]["data"]
        with rasterio.open(path) as ds:
            assert ds.tags()["source"] == source
        item = pystac.Item.from_file(path[: -len(".tif")] + ".stac.json")
        assert item.properties["appliance:source"] == source
        links = [link.get_absolute_href() for link in item.get_links(pystac.RelType.DERIVED_FROM)]
        assert links == ([] if source == "upload" else [str(flood_dirs["media"] / "scene.tif")])


def test_pooling_url_input_from_an_allowed_host(flood_server, offline_mask, tmp_path):
    """Read by range requests (tests/geo/test_served_remote.py: a window of a large scene)."""
    (tmp_path / "scene.tif").write_bytes(SAMPLE_SCENE.read_bytes())
    with RangeServer(tmp_path) as source:
        response = pooling(flood_server, f"{source.url}/scene.tif", data_format="url")
        assert response.status_code == 200, response.text
        (tmp_path / "out.tif").write_bytes(base64.b64decode(response.json()["data"]["data"]))
        assert_same_mask(tmp_path / "out.tif", offline_mask)
        port = source.url.rsplit(":", 1)[1]
        refused = pooling(flood_server, f"http://localhost:{port}/scene.tif", data_format="url")
        assert refused.status_code == 400 and error(refused)["param"] == "data.data", refused.text
        assert "allowed_media_domains" in error(refused)["message"]


def test_raw_geotiff_body_and_quicklook(flood_server, offline_mask, tmp_path):
    headers = {**AUTH, "Content-Type": "image/tiff"}
    mask = httpx.post(f"{flood_server.base}/v1/pool", content=SAMPLE_SCENE.read_bytes(), headers=headers, timeout=120)
    assert mask.status_code == 200 and mask.headers["content-type"] == "image/tiff", mask.text
    (tmp_path / "raw.tif").write_bytes(mask.content)
    assert_same_mask(tmp_path / "raw.tif", offline_mask)
    with rasterio.open(tmp_path / "raw.tif") as ds:
        assert ds.tags()["source"] == "upload"
    quicklook = httpx.post(f"{flood_server.base}/v1/pool?quicklook=true", content=SAMPLE_SCENE.read_bytes(),
                           headers=headers, timeout=120)
    assert quicklook.status_code == 200 and quicklook.content[:8] == b"\x89PNG\r\n\x1a\n"


def test_concurrent_scenes_share_the_engine_and_stay_right(flood_server, offline_mask, tmp_path):
    before = metrics(flood_server.base)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(lambda _: pooling(flood_server, scene_b64()), range(4)))
    for i, response in enumerate(responses):
        assert response.status_code == 200, response.text
        (tmp_path / f"{i}.tif").write_bytes(base64.b64decode(response.json()["data"]["data"]))
        assert_same_mask(tmp_path / f"{i}.tif", offline_mask)
    after = metrics(flood_server.base)
    tiles = after[("appliance_tiles_total", ())] - before.get(("appliance_tiles_total", ()), 0)
    assert tiles == 4 * tiles_per_scene(offline_mask)
    key = ("appliance_pool_requests_total", (("outcome", "success"),))
    assert after[key] - before.get(key, 0) == 4
    assert after[("appliance_num_requests_running", ())] == 0


def tiles_per_scene(mask) -> int:
    """The tile count `appliance run` reports for the scene (in its mask's `display` line, via the tags)."""
    from appliance.stages.geo.plan import plan_tiles

    with rasterio.open(mask) as ds:
        return plan_tiles(ds.height, ds.width, 512, 512 - 512 // 8).count


BAD = [
    ("not a GeoTIFF", {"data": base64.b64encode(b"hello, not a tiff").decode()}, 400, "data.data", "GeoTIFF"),
    ("bad base64", {"data": "%%%"}, 400, "data.data", "base64"),
    ("unknown data format", {"data_format": "s3"}, 400, "data.data_format", "allowed: b64_json, url, path"),
    ("path outside the media dir", {"data": "/etc/passwd", "data_format": "path"}, 400, "data.data", "outside"),
    ("private URL", {"data": "http://169.254.169.254/latest", "data_format": "url"}, 400, "data.data", "169.254"),
]


@pytest.mark.parametrize("label,data,status,param,fragment", BAD, ids=[b[0] for b in BAD])
def test_bad_pooling_requests_name_the_field(flood_server, label, data, status, param, fragment):
    body = {"data": {"data": scene_b64(), "data_format": "b64_json", "out_data_format": "b64_json", **data}}
    response = httpx.post(f"{flood_server.base}/pooling", json=body, headers=AUTH, timeout=60)
    assert response.status_code == status, response.text
    err = error(response)
    assert err["param"] == param and fragment in err["message"], err
    assert "spool" not in err["message"]  # spool paths never reach a client


def test_unknown_query_parameters_are_400s_naming_them(flood_server):
    headers = {**AUTH, "Content-Type": "image/tiff"}
    typo = httpx.post(f"{flood_server.base}/v1/pool?quicklok=true", content=SAMPLE_SCENE.read_bytes(),
                      headers=headers, timeout=60)
    assert typo.status_code == 400, typo.text
    assert error(typo)["param"] == "quicklok"
    assert error(typo)["message"] == "quicklok: unknown query parameter; allowed: quicklook, date"


def test_model_key_and_content_type_checks(flood_server):
    wrong_model = pooling(flood_server, scene_b64(), model="other")
    assert wrong_model.status_code == 404 and error(wrong_model)["param"] == "model"
    no_key = httpx.post(f"{flood_server.base}/pooling", json={}, timeout=10)
    assert no_key.status_code == 401 and "API key" in error(no_key)["message"]
    wrong_key = httpx.get(f"{flood_server.base}/v1/models", headers={"Authorization": "Bearer nope"}, timeout=10)
    assert wrong_key.status_code == 401
    for open_route in ("/health", "/ready", "/version", "/metrics"):
        assert httpx.get(f"{flood_server.base}{open_route}", timeout=10).status_code == 200, open_route
    form = httpx.post(f"{flood_server.base}/v1/pool", content=b"x", headers={**AUTH, "Content-Type": "text/plain"},
                      timeout=10)
    assert form.status_code == 415 and "image/tiff" in error(form)["message"]
    models = httpx.get(f"{flood_server.base}/v1/models", headers=AUTH, timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["flood"]


def test_a_client_that_leaves_stops_the_remaining_tiles(flood_server, flood_dirs, tmp_path):
    """A 4096 x 4096 scene is 100 tiles (seconds of work); the client hangs up after the first ones ran."""
    scene = tmp_path / "big.tif"
    rows, cols = np.indices((4096, 4096)) // 64
    data = np.stack([(rows * (b + 7) + cols * 13) % 3000 for b in range(6)]).astype("uint16")
    with rasterio.open(scene, "w", driver="GTiff", height=4096, width=4096, count=6, dtype="uint16",
                       crs="EPSG:32615", transform=rasterio.Affine(30, 0, 0, 0, -30, 0), compress="deflate") as dst:
        dst.write(data)
    before = metrics(flood_server.base)
    total = plan_tiles_for(scene)
    headers = {**AUTH, "Content-Type": "image/tiff"}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{flood_server.base}/v1/pool", content=scene.read_bytes(), headers=headers, timeout=1.0)
    deadline = time.monotonic() + 120
    while True:
        after = metrics(flood_server.base)
        aborted = after.get(("appliance_pool_requests_total", (("outcome", "abort"),)), 0) - \
            before.get(("appliance_pool_requests_total", (("outcome", "abort"),)), 0)
        if (aborted, after[("appliance_num_requests_running", ())]) == (1, 0) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert aborted == 1 and after[("appliance_num_requests_running", ())] == 0
    time.sleep(1.0)  # nothing more runs for it
    ran = metrics(flood_server.base)[("appliance_tiles_total", ())] - before[("appliance_tiles_total", ())]
    assert 0 < ran < total, (ran, total)
    # The aborted writer removes its temp file as its thread unwinds: seconds on a busy machine; the deadline
    # only bounds a failure.
    deadline = time.monotonic() + 120
    while spooled_uploads(flood_dirs["spool"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not spooled_uploads(flood_dirs["spool"])


def spooled_uploads(spool) -> list:
    """/v1/pool's spooled files (`scenes/` holds the scene jobs, which keep theirs while they live)."""
    return [path for path in spool.iterdir() if path.name != "scenes"]


def plan_tiles_for(path) -> int:
    from appliance.stages.geo.plan import plan_tiles

    with rasterio.open(path) as ds:
        return plan_tiles(ds.height, ds.width, 512, 448).count


def test_a_chat_route_on_the_pooling_server_names_the_routes_it_has(flood_server):
    answer = httpx.post(f"{flood_server.base}/v1/chat/completions", json={"messages": []}, headers=AUTH,
                         timeout=10)
    message = answer.json()["error"]["message"]
    assert answer.status_code == 404 and "/v1/chat/completions: no such route" in message
    routes = {path.strip() for path in message.partition("this server answers ")[2].split(",")}
    assert {"/pooling", "/v1/pool", "/v1/models", "/health"} <= routes
    assert "/v1/chat/completions" not in routes
