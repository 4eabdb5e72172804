"""`/v1/scenes` on a real `appliance serve pipeline=prithvi_flood` (its own server: `server.scenes.max_kept=1`,
an API key, a spool directory the tests look into), with httpx: a scene posted as a job, polled, its
summary and files read; a given date reaching the mask; refusals; DELETE of a running scene; pruning of
finished ones."""
import io
import json
import time

import httpx
import numpy as np
import pytest
import rasterio
from PIL import Image

from appliance.protocol.scenes import Scene, SceneDeleted, SceneList, SceneSummary
from tests.geo.hls import RangeServer
from tests.server_process import server_process
from tests.servers import API_KEY, SAMPLE_SCENE, error, metrics

AUTH = {"Authorization": f"Bearer {API_KEY}"}
TIFF = {**AUTH, "Content-Type": "image/tiff"}
PREVIEW_SIZE = 1024  # server.scenes.preview_size's default
POLL_S = 180  # how long a poll waits for a scene to end before the test fails


@pytest.fixture(scope="module")
def spool(tmp_path_factory):
    return tmp_path_factory.mktemp("scenes_spool")


@pytest.fixture(scope="module")
def server(tmp_path_factory, spool):
    with server_process("pipeline=prithvi_flood", "server.served_model_name=flood", "server.scenes.max_kept=1",
                        "server.allowed_media_domains=[127.0.0.1]", f"server.spool_dir={spool}",
                        cwd=tmp_path_factory.mktemp("scenes_cwd"), env={"APPLIANCE_API_KEY": API_KEY}) as server:
        yield server


@pytest.fixture(scope="module")
def big_scene(tmp_path_factory):
    """4096 x 4096: 100 tiles, seconds of work (as tests/serving/test_pooling.py's leaving client)."""
    path = tmp_path_factory.mktemp("big") / "big.tif"
    rows, cols = np.indices((4096, 4096)) // 64
    data = np.stack([(rows * (b + 7) + cols * 13) % 3000 for b in range(6)]).astype("uint16")
    with rasterio.open(path, "w", driver="GTiff", height=4096, width=4096, count=6, dtype="uint16",
                       crs="EPSG:32615", transform=rasterio.Affine(30, 0, 0, 0, -30, 0), compress="deflate") as dst:
        dst.write(data)
    return path


def tile_count(path) -> int:
    """The tiles the `tile` stage plans for the scene (512-pixel tiles, stride 448: the pipeline's)."""
    from appliance.stages.geo.plan import plan_tiles

    with rasterio.open(path) as ds:
        return plan_tiles(ds.height, ds.width, 512, 448).count


def post_scene(server, content: bytes = None, **kwargs):
    if content is not None:
        kwargs = {"content": content, "headers": TIFF, **kwargs}
    return httpx.post(f"{server.base}/v1/scenes", timeout=60, **kwargs)


def get(server, path: str, **kwargs):
    return httpx.get(f"{server.base}/v1/scenes{path}", headers=AUTH, timeout=60, **kwargs)


def scene(server, scene_id: str) -> dict:
    answer = get(server, f"/{scene_id}")
    assert answer.status_code == 200, answer.text
    Scene.model_validate(answer.json())
    return answer.json()


def until_ended(server, scene_id: str, seen: list = None) -> dict:
    """Poll until the scene is done or failed; `seen` collects (tiles_done, tiles_total) as polled."""
    deadline = time.monotonic() + POLL_S
    while True:
        body = scene(server, scene_id)
        if seen is not None:
            seen.append((body["tiles_done"], body["tiles_total"]))
        if body["status"] in ("done", "failed"):
            return body
        assert time.monotonic() < deadline, f"scene {scene_id} still {body['status']} after {POLL_S} s"
        time.sleep(0.05)


def posted(server, content: bytes = None, **kwargs) -> dict:
    answer = post_scene(server, content, **kwargs)
    assert answer.status_code == 202, answer.text
    body = answer.json()
    assert answer.headers["location"] == f"scenes/{body['id']}"
    Scene.model_validate(body)
    return body


@pytest.fixture(scope="module")
def done_sample(server, tmp_path_factory):
    """The sample scene posted and polled to the end; its object, the polled counts, and its files."""
    first = posted(server, SAMPLE_SCENE.read_bytes())
    assert (first["status"], first["tiles_done"], first["result"], first["files"]) == ("queued", 0, None, [])
    seen = []
    body = until_ended(server, first["id"], seen)
    assert body["status"] == "done", body
    files = {name: get(server, f"/{body['id']}/{name}") for name in body["files"]}
    return body, seen, files


def test_a_posted_scene_is_polled_to_done_with_counts_that_never_go_down(server, done_sample):
    body, seen, _ = done_sample
    assert body["tiles_total"] > 0 and body["tiles_done"] == body["tiles_total"]
    counts = [done for done, _ in seen]
    assert counts == sorted(counts)
    assert all(total in (None, body["tiles_total"]) for _, total in seen)
    assert body["files"] == ["mask.tif", "item.json", "scene.png", "mask.png"]
    SceneSummary.model_validate(body["result"])
    assert body["result"]["acquisition_date"] is body["result"]["acquisition_date_source"] is None  # none in the sample
    log_line = next(line for line in server.output().splitlines() if "POST /v1/scenes 202" in line)
    assert f"request_id={body['id']}" in log_line


def test_the_mask_is_v1_pools_and_the_summary_counts_it(server, done_sample, tmp_path):
    body, _, files = done_sample
    tif = files["mask.tif"]
    assert tif.status_code == 200 and tif.headers["content-type"] == "image/tiff"
    assert tif.headers["content-disposition"] == f'attachment; filename="{body["id"]}.mask.tif"'
    pooled = httpx.post(f"{server.base}/v1/pool", content=SAMPLE_SCENE.read_bytes(), headers=TIFF, timeout=120)
    assert pooled.status_code == 200, pooled.text
    (tmp_path / "scene.tif").write_bytes(tif.content)
    (tmp_path / "pool.tif").write_bytes(pooled.content)
    with rasterio.open(tmp_path / "scene.tif") as ds, rasterio.open(tmp_path / "pool.tif") as expected:
        mask = ds.read(1)
        assert np.array_equal(mask, expected.read(1))
        assert (ds.crs, ds.transform, ds.nodata) == (expected.crs, expected.transform, expected.nodata)
        crs, bounds, size = ds.crs.to_string(), list(ds.bounds), (ds.width, ds.height)
    summary = body["result"]
    assert (summary["crs"], (summary["width"], summary["height"])) == (crs, size)
    assert summary["bounds"] == pytest.approx(bounds, rel=1e-12)
    valid = mask != 255
    assert summary["valid_pixels"] == int(valid.sum()) and summary["nodata_pixels"] == int((~valid).sum())
    for entry in summary["classes"]:
        assert entry["pixels"] == int((mask == entry["index"]).sum()), entry
    assert sum(entry["pixels"] for entry in summary["classes"]) == summary["valid_pixels"]
    water = next(entry for entry in summary["classes"] if entry["index"] == 1)
    assert water["share"] == pytest.approx(float((mask == 1).sum()) / max(int(valid.sum()), 1))


def test_the_previews_are_pngs_of_one_size_and_the_mask_is_a_palette_with_land_transparent(done_sample):
    body, _, files = done_sample
    scene_png, mask_png = (Image.open(io.BytesIO(files[name].content)) for name in ("scene.png", "mask.png"))
    assert files["scene.png"].headers["content-type"] == "image/png" == files["mask.png"].headers["content-type"]
    assert scene_png.format == mask_png.format == "PNG"
    assert scene_png.size == mask_png.size == (body["result"]["preview"]["width"], body["result"]["preview"]["height"])
    assert max(scene_png.size) <= PREVIEW_SIZE and scene_png.mode == "RGB"
    assert mask_png.mode == "P"
    transparency = mask_png.info["transparency"]
    assert (transparency[0] if isinstance(transparency, bytes) else transparency) == 0  # class 0: see-through
    classes = set(np.unique(np.asarray(mask_png)).tolist())
    assert classes <= set(range(len(body["result"]["classes"]) + 1))  # classes, and nodata after them


def test_item_json_is_the_masks_stac_item(done_sample):
    body, _, files = done_sample
    answer = files["item.json"]
    assert answer.headers["content-type"] == "application/geo+json"
    assert answer.headers["content-disposition"] == f'attachment; filename="{body["id"]}.mask.stac.json"'
    item = json.loads(answer.content)
    assert item["type"] == "Feature" and item["id"] == f"{body['id']}.mask"
    assert item["assets"]["mask"]["href"] == f"{body['id']}.mask.tif"  # the name the mask downloads under
    west, south, east, north = body["result"]["lonlat_bounds"]
    assert item["bbox"] == pytest.approx([west, south, east, north], abs=1e-6)
    assert item["geometry"]["type"] == "Polygon"


def test_the_list_is_the_model_and_shows_the_settings(server, done_sample):
    listed = get(server, "")
    assert listed.status_code == 200
    SceneList.model_validate(listed.json())
    assert (listed.json()["keep_s"], listed.json()["max_kept"]) == (900.0, 1)
    assert listed.json()["max_request_bytes"] > 0


def test_unknown_ids_and_files_are_404s_naming_them(server, done_sample):
    kept = get(server, "").json()["data"][0]  # max_kept=1: the one finished scene kept
    unknown = get(server, "/scene-nope")
    assert unknown.status_code == 404 and error(unknown)["param"] == "id"
    assert error(unknown)["message"] == ("scene 'scene-nope': no such scene (finished scenes are kept "
                                         "server.scenes.keep_s=900 s)")
    assert get(server, "/scene-nope/mask.tif").status_code == 404
    other = get(server, f"/{kept['id']}/input.tif")
    assert other.status_code == 404 and error(other)["param"] == "file"
    deleted = httpx.delete(f"{server.base}/v1/scenes/scene-nope", headers=AUTH, timeout=10)
    assert deleted.status_code == 404 and error(deleted)["param"] == "id"


def test_a_running_scenes_files_are_409_and_delete_stops_it(server, spool, big_scene):
    before = metrics(server.base)
    body = posted(server, big_scene.read_bytes())
    deadline = time.monotonic() + POLL_S
    seen = []
    while not (seen and seen[-1]["status"] == "running" and seen[-1]["tiles_done"] > 0):
        seen.append(scene(server, body["id"]))
        assert time.monotonic() < deadline and seen[-1]["status"] in ("queued", "running"), seen[-1]
        time.sleep(0.05)
    counts = [s["tiles_done"] for s in seen]
    assert counts == sorted(counts) and seen[-1]["tiles_total"] == tile_count(big_scene)
    busy = get(server, f"/{body['id']}/mask.tif")
    assert busy.status_code == 409, busy.text
    assert error(busy)["message"] == f"scene '{body['id']}' is running; its files exist once it is done"
    deleted = httpx.delete(f"{server.base}/v1/scenes/{body['id']}", headers=AUTH, timeout=60)
    assert deleted.status_code == 200, deleted.text
    assert SceneDeleted.model_validate(deleted.json()).id == body["id"]
    assert not (spool / "scenes" / body["id"]).exists()
    assert get(server, f"/{body['id']}").status_code == 404
    deadline = time.monotonic() + POLL_S
    abort = ("appliance_pool_requests_total", (("outcome", "abort"),))
    while True:
        after = metrics(server.base)
        if (after.get(abort, 0) - before.get(abort, 0), after[("appliance_num_requests_running", ())]) == (1, 0):
            break
        assert time.monotonic() < deadline, "the deleted scene still runs"
        time.sleep(0.1)


def test_max_kept_1_deletes_the_older_finished_scene(server, spool):
    first = until_ended(server, posted(server, SAMPLE_SCENE.read_bytes())["id"])
    assert (spool / "scenes" / first["id"]).is_dir()
    second = until_ended(server, posted(server, SAMPLE_SCENE.read_bytes())["id"])
    assert first["status"] == second["status"] == "done"
    assert get(server, f"/{first['id']}").status_code == 404
    assert not (spool / "scenes" / first["id"]).exists()
    assert [s["id"] for s in get(server, "").json()["data"]] == [second["id"]]


def test_a_scene_that_is_no_geotiff_fails_with_v1_pools_message(server):
    not_tiff = b"hello, not a tiff"
    failed = until_ended(server, posted(server, not_tiff)["id"])
    assert failed["status"] == "failed" and failed["result"] is None and failed["files"] == []
    pooled = httpx.post(f"{server.base}/v1/pool", content=not_tiff, headers=TIFF, timeout=60)
    assert pooled.status_code == 400
    assert failed["error"] == error(pooled)
    busy = get(server, f"/{failed['id']}/mask.tif")
    assert busy.status_code == 409 and "is failed" in error(busy)["message"]
    warned = [line for line in server.output().splitlines() if f"scene {failed['id']} failed: " in line]
    assert len(warned) == 1 and " WARNING " in warned[0] and failed["error"]["message"] in warned[0], warned


def test_a_private_url_fails_the_scene_naming_url(server):
    failed = until_ended(server, posted(server, json={"url": "http://169.254.169.254/scene.tif"}, headers=AUTH)["id"])
    assert failed["status"] == "failed" and failed["error"]["param"] == "url", failed
    assert "169.254" in failed["error"]["message"]


REFUSED = [
    ("wrong type", {"content": b"x", "headers": {**AUTH, "Content-Type": "text/plain"}}, 415, None, "image/tiff"),
    ("empty body", {"content": b"", "headers": TIFF}, 400, "body", "empty"),
    ("query parameter", {"content": b"x", "headers": TIFF, "params": {"quicklook": "true"}}, 400, "quicklook",
     "unknown query parameter"),
    ("unknown field", {"json": {"url": "https://example.com/a.tif", "aoi": [0, 0, 1, 1]}, "headers": AUTH}, 400,
     "aoi", "unknown field"),
    ("no url", {"json": {}, "headers": AUTH}, 400, "url", "url"),
    ("not http", {"json": {"url": "ftp://example.com/a.tif"}, "headers": AUTH}, 400, "url", "http(s)"),
    ("bucket not allowed", {"json": {"url": "s3://private/a.tif"}, "headers": AUTH}, 400, "url",
     "allowed_s3_buckets"),
    ("no key", {"content": b"x", "headers": {"Content-Type": "image/tiff"}}, 401, None, "API key"),
    ("bad query date", {"content": b"x", "headers": TIFF, "params": {"date": "30/06/2024"}}, 400, "date",
     "date: '30/06/2024' is not a date; give a date as YYYY-MM-DD"),
    ("bad json date", {"json": {"url": "https://example.com/a.tif", "date": "2024-13-01"}, "headers": AUTH}, 400,
     "date", "date: '2024-13-01' is not a date"),
    ("json date not a string", {"json": {"url": "https://example.com/a.tif", "date": 20240630}, "headers": AUTH},
     400, "date", "date: "),
    ("query date with json", {"json": {"url": "https://example.com/a.tif"}, "headers": AUTH,
                              "params": {"date": "2024-06-30"}}, 400, "date", "give the date in it"),
]


@pytest.mark.parametrize("label,kwargs,status,param,fragment", REFUSED, ids=[r[0] for r in REFUSED])
def test_refused_posts_name_their_field_and_leave_nothing(server, spool, label, kwargs, status, param, fragment):
    answer = httpx.post(f"{server.base}/v1/scenes", timeout=60, **kwargs)
    assert answer.status_code == status, answer.text
    assert error(answer)["param"] == param and fragment in error(answer)["message"], error(answer)
    listed = get(server, "").json()["data"]
    assert all(s["status"] in ("done", "failed") for s in listed)  # a refused POST makes no job
    assert {path.name for path in (spool / "scenes").iterdir()} <= {s["id"] for s in listed}  # nor files


def test_a_given_date_reaches_the_mask_and_the_summary_in_both_forms(server, tmp_path):
    (tmp_path / "scene.tif").write_bytes(SAMPLE_SCENE.read_bytes())
    with RangeServer(tmp_path) as source:
        sends = [("2024-06-30", lambda: posted(server, SAMPLE_SCENE.read_bytes(), params={"date": "2024-06-30"})),
                 ("2023-01-02", lambda: posted(server, json={"url": f"{source.url}/scene.tif", "date": "2023-01-02"},
                                               headers=AUTH))]
        for date, send in sends:
            body = until_ended(server, send()["id"])
            assert body["status"] == "done", body
            summary = body["result"]
            assert (summary["acquisition_date"], summary["acquisition_date_source"]) == (date, "date given")
            mask = get(server, f"/{body['id']}/mask.tif")
            assert mask.status_code == 200, mask.text
            with rasterio.open(io.BytesIO(mask.content)) as ds:
                assert ds.tags()["acquisition_date"] == date


def test_without_the_key_every_scene_route_is_401(server):
    for method, path in (("GET", ""), ("GET", "/scene-x"), ("GET", "/scene-x/mask.tif"), ("DELETE", "/scene-x")):
        answer = httpx.request(method, f"{server.base}/v1/scenes{path}", timeout=10)
        assert answer.status_code == 401, (method, path)


def test_the_openapi_document_describes_the_scene_routes_with_the_models(server):
    document = httpx.get(f"{server.base}/openapi.json", timeout=10).json()
    paths, components = document["paths"], document["components"]["schemas"]
    ref = "#/components/schemas/{}".format
    assert paths["/v1/scenes"]["get"]["responses"]["200"]["content"]["application/json"]["schema"] == \
        {"$ref": ref("SceneList")}
    create = paths["/v1/scenes"]["post"]
    assert create["responses"]["202"]["content"]["application/json"]["schema"] == {"$ref": ref("Scene")}
    assert "200" not in create["responses"]
    assert {"image/tiff", "application/json"} <= set(create["requestBody"]["content"])
    assert [(p["name"], p["in"], p["schema"]["type"]) for p in create["parameters"]] == [("date", "query", "string")]
    assert paths["/v1/scenes/{id}"]["delete"]["responses"]["200"]["content"]["application/json"]["schema"] == \
        {"$ref": ref("SceneDeleted")}
    files = paths["/v1/scenes/{id}/{file}"]["get"]
    assert set(files["responses"]["200"]["content"]) == {"image/tiff", "application/geo+json", "image/png"}
    parameters = {p["name"]: p for p in files["parameters"]}
    assert parameters["file"]["schema"]["enum"] == ["mask.tif", "item.json", "scene.png", "mask.png"]
    assert parameters["id"]["in"] == "path" and parameters["id"]["required"]
    own = SceneSummary.model_json_schema(ref_template="#/components/schemas/{model}")
    own.pop("$defs", None)
    assert components["SceneSummary"] == own
