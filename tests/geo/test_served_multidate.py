"""`appliance serve pipeline=prithvi_crops` (a 3-date model): the crops sample sent as a list of its three
dates (base64, allowed paths, URLs read by windows) or as the stacked file (`/pooling`, `/v1/pool`,
`/v1/scenes`, where the dates may also come as a multipart form of files) gives the class map `appliance run`
makes of the same files; a wrong count of dates, a date on another grid, a one-date file as the stacked body,
a form's unknown or empty parts, or dates sent to a one-date server answer 400 naming the field (and the
date)."""
import base64
import time

import httpx
import numpy as np
import pytest
import rasterio
from affine import Affine

from appliance.config.compose import compose
from appliance.fetch import FetchPolicy
from appliance.stages.geo.scene import inspect_scene
from appliance.stages.geo.served_scenes import served_scene_spec
from tests.conftest import REPO, run_cli
from tests.geo.conftest import NODATA_FILL
from tests.geo.hls import RangeServer, masks_equal
from tests.server_process import server_process
from tests.servers import API_KEY, error

AUTH = {"Authorization": f"Bearer {API_KEY}"}
TIFF = {**AUTH, "Content-Type": "image/tiff"}
SAMPLES = REPO / "appliance" / "assets" / "samples"
DATES = [SAMPLES / f"crops_sample_date{i}.tif" for i in (1, 2, 3)]
STACKED = SAMPLES / "crops_sample_stacked.tif"
WHEN = ["2023-04-15", "2023-07-01", "2023-09-15"]  # the samples' ACQUISITION_DATE tags
GIVEN = ["2022-05-01", "2022-06-01", "2022-08-01"]
POLL_S = 120  # how long a test waits for a scene job before failing


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    """The allowed media directory: the three dates, the stacked file, and date 2 moved by one pixel."""
    root = tmp_path_factory.mktemp("crops_media")
    for path in (*DATES, STACKED):
        (root / path.name).write_bytes(path.read_bytes())
    with rasterio.open(DATES[1]) as src:
        profile, data = src.profile, src.read()
        profile["transform"] = src.transform @ Affine.translation(1, 0)
    with rasterio.open(root / "date2_moved.tif", "w", **profile) as dst:
        dst.write(data)
    return root


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """`appliance run`'s class map of the three dates (test_crops: the stacked file gives the same)."""
    out = tmp_path_factory.mktemp("crops_offline") / "crops.tif"
    result = run_cli("run", "pipeline=prithvi_crops", "input=[" + ",".join(map(str, DATES)) + "]",
                     f"output={out}", "pipeline.stages.stitch.progress=false", timeout=300,
                     env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def crops_spool(tmp_path_factory):
    return tmp_path_factory.mktemp("crops_serve")


@pytest.fixture(scope="module")
def crops_server(crops_spool, media):
    root = crops_spool
    with server_process("pipeline=prithvi_crops", "server.served_model_name=crops",
                        f"server.allowed_local_media_dir={media}", "server.allowed_media_domains=[127.0.0.1]",
                        f"server.spool_dir={root}", cwd=root, env={"APPLIANCE_API_KEY": API_KEY}) as server:
        yield server


def b64(path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def pooling(server, data, data_format, **fields):
    body = {"model": "crops", "data": {"data": data, "data_format": data_format, **fields}}
    return httpx.post(f"{server.base}/pooling", json=body, headers=AUTH, timeout=300)


def saved(tmp_path, name: str, content: bytes):
    path = tmp_path / name
    path.write_bytes(content)
    return path


def pooled(response, tmp_path, name: str):
    assert response.status_code == 200, response.text
    return saved(tmp_path, name, base64.b64decode(response.json()["data"]["data"]))


def acquisition_dates(path) -> str:
    with rasterio.open(path) as ds:
        return ds.tags()["acquisition_dates"]


def test_pooling_takes_the_dates_as_base64_paths_or_urls(crops_server, offline, tmp_path):
    listed = pooled(pooling(crops_server, [b64(p) for p in DATES], "b64_json"), tmp_path, "b64.tif")
    assert masks_equal(listed, offline)
    assert acquisition_dates(listed) == ",".join(WHEN)  # each upload's own date tag
    named = pooled(pooling(crops_server, [p.name for p in DATES], "path"), tmp_path, "paths.tif")
    assert masks_equal(named, offline)
    with RangeServer(SAMPLES) as source:
        urls = [f"{source.url}/{p.name}" for p in DATES]
        fetched = pooled(pooling(crops_server, urls, "url"), tmp_path, "urls.tif")
        assert set(source.sent) == {p.name for p in DATES}  # each date read through the fetcher
    assert masks_equal(fetched, offline)


def test_every_date_of_a_url_list_is_read_through_the_fetcher():
    """Each date's own spec carries the request's RemoteReads (check_dates opens each date by it): no date
    falls back to GDAL's /vsicurl/, which would skip the fetcher's checks."""
    geo = compose(["pipeline=prithvi_crops"]).model.geo
    policy = FetchPolicy(allowed_domains=("127.0.0.1",), max_bytes=1 << 30, total_timeout_s=30)
    with RangeServer(SAMPLES) as source:
        urls = [f"{source.url}/{p.name}" for p in DATES]
        spec = served_scene_spec(urls, geo, policy, "data.data", [], frames=3)
        try:
            info = inspect_scene(spec, 0, list(geo.bands), frames=3, nodata_fill=NODATA_FILL)
        finally:
            spec.fetch.close()
    assert [d.fetch for d in spec.dates] == [spec.fetch] * 3 and info.fetch is spec.fetch
    assert set(spec.fetch.files) == set(urls)


def test_the_stacked_file_gives_the_same_map_on_every_route(crops_server, offline, tmp_path):
    stacked = pooled(pooling(crops_server, b64(STACKED), "b64_json", date=GIVEN), tmp_path, "stacked.tif")
    assert masks_equal(stacked, offline)
    assert acquisition_dates(stacked) == ",".join(GIVEN)  # a stacked file's dates only as given
    raw = httpx.post(f"{crops_server.base}/v1/pool", params={"date": ",".join(GIVEN)},
                     content=STACKED.read_bytes(), headers=TIFF, timeout=300)
    assert raw.status_code == 200, raw.text
    assert masks_equal(saved(tmp_path, "raw.tif", raw.content), offline)
    assert acquisition_dates(tmp_path / "raw.tif") == ",".join(GIVEN)


def ended_scene(server, **kwargs) -> dict:
    """POST /v1/scenes, poll until it ends; the scene object, done or failed."""
    answer = httpx.post(f"{server.base}/v1/scenes", timeout=60, **kwargs)
    assert answer.status_code == 202, answer.text
    scene_id, deadline = answer.json()["id"], time.monotonic() + POLL_S
    while True:
        body = httpx.get(f"{server.base}/v1/scenes/{scene_id}", headers=AUTH, timeout=60).json()
        if body["status"] in ("done", "failed"):
            return body
        assert time.monotonic() < deadline, body
        time.sleep(0.2)


def scene_job(server, tmp_path, name: str, **kwargs):
    """POST /v1/scenes, poll until it ends; the mask of a done scene (else fail with its error)."""
    body = ended_scene(server, **kwargs)
    assert body["status"] == "done", body
    mask = httpx.get(f"{server.base}/v1/scenes/{body['id']}/mask.tif", headers=AUTH, timeout=60)
    return saved(tmp_path, name, mask.content)


def test_scene_jobs_take_a_list_of_urls_and_a_stacked_upload(crops_server, offline, tmp_path):
    with RangeServer(SAMPLES) as source:
        urls = [f"{source.url}/{p.name}" for p in DATES]
        listed = scene_job(crops_server, tmp_path, "urls.tif", json={"urls": urls, "date": GIVEN}, headers=AUTH)
    assert masks_equal(listed, offline) and acquisition_dates(listed) == ",".join(GIVEN)
    uploaded = scene_job(crops_server, tmp_path, "upload.tif", params=[("date", d) for d in WHEN],
                         content=STACKED.read_bytes(), headers=TIFF)
    assert masks_equal(uploaded, offline) and acquisition_dates(uploaded) == ",".join(WHEN)


def form(paths, name: str = "files"):
    """httpx's `files=`: one part per path, all named `name`, in order."""
    return [(name, (path.name, path.read_bytes(), "image/tiff")) for path in paths]


def test_scene_jobs_take_the_dates_as_a_form_of_files(crops_server, crops_spool, offline, tmp_path):
    given = scene_job(crops_server, tmp_path, "form.tif", files=form(DATES), data={"date": ",".join(GIVEN)},
                      headers=AUTH)
    assert masks_equal(given, offline) and acquisition_dates(given) == ",".join(GIVEN)
    own = scene_job(crops_server, tmp_path, "form_own.tif", files=form(DATES), headers=AUTH)
    assert masks_equal(own, offline) and acquisition_dates(own) == ",".join(WHEN)  # each file's own date tag
    # A done job keeps its dates (the map's scene tiles read them) until it is deleted.
    for job in [path for path in (crops_spool / "scenes").iterdir() if any(path.glob("input.date*"))]:
        assert sorted(p.name for p in job.glob("input*")) == [f"input.date{i}.tif" for i in (1, 2, 3)]
        assert httpx.delete(f"{crops_server.base}/v1/scenes/{job.name}", headers=AUTH, timeout=60).status_code == 200
        assert not job.exists()


def test_a_form_date_on_another_grid_fails_the_scene_naming_its_part(crops_server, media):
    dates = [DATES[0], media / "date2_moved.tif", DATES[2]]
    failed = ended_scene(crops_server, files=form(dates), headers=AUTH)
    assert failed["status"] == "failed" and failed["error"]["param"] == "files[1]", failed
    assert failed["error"]["code"] == 400
    assert failed["error"]["message"].startswith("files[1]: date 2 is on another grid than date 1 (files[0])")
    assert "/tmp" not in failed["error"]["message"] and "input.date" not in failed["error"]["message"]


def truncated_form(server):
    body = b"--b\r\nContent-Disposition: form-data; name=\"files\"; filename=\"a.tif\"\r\n\r\nII*\0"
    return httpx.post(f"{server.base}/v1/scenes", content=body, timeout=60,
                      headers={**AUTH, "Content-Type": "multipart/form-data; boundary=b"})


def posted_form(server, files, **kwargs):
    return httpx.post(f"{server.base}/v1/scenes", files=files, headers=AUTH, timeout=60, **kwargs)


FORM_REFUSALS = [
    ("two files", lambda s: posted_form(s, form(DATES[:2])), "files",
     "files: 2 files given (crops_sample_date1.tif, crops_sample_date2.tif) but the model takes 3 acquisitions"),
    ("four files", lambda s: posted_form(s, form([*DATES, DATES[0]])), "files", "files: more than 3 files given"),
    ("dates only", lambda s: posted_form(s, [("date", (None, ",".join(WHEN)))]), "files", "files: no file given"),
    ("unknown part", lambda s: posted_form(s, form(DATES) + [("quicklook", (None, "true"))]), "quicklook",
     "quicklook: unknown form field"),
    ("parts named file", lambda s: posted_form(s, form(DATES, "file")), "file", "file: unknown form field"),
    ("empty date file", lambda s: posted_form(s, [form(DATES)[0], ("files", ("b.tif", b"", "image/tiff")),
                                                  form(DATES)[2]]), "files[1]", "files[1]: empty"),
    ("one date", lambda s: posted_form(s, form(DATES), data={"date": "2023-04-15"}), "date",
     "date: the model takes 3 dates"),
    ("bad date", lambda s: posted_form(s, form(DATES), data={"date": "2023-04-15,2023-13-01,2023-09-15"}), "date",
     "'2023-13-01' is not a date"),
    ("query date", lambda s: posted_form(s, form(DATES), params={"date": ",".join(WHEN)}), "date",
     "date: with a form give the dates in its date field"),
    ("cut short", truncated_form, "body", "body: the form ended before its closing boundary"),
]


@pytest.mark.parametrize("send, param, fragment", [r[1:] for r in FORM_REFUSALS], ids=[r[0] for r in FORM_REFUSALS])
def test_refused_forms_name_the_field_and_leave_nothing(crops_server, crops_spool, send, param, fragment):
    response = send(crops_server)
    assert response.status_code == 400, response.text
    body = error(response)
    assert body["param"] == param and fragment in body["message"], body
    listed = httpx.get(f"{crops_server.base}/v1/scenes", headers=AUTH, timeout=60).json()["data"]
    assert {path.name for path in (crops_spool / "scenes").iterdir()} <= {s["id"] for s in listed}  # no job's files


def test_the_form_and_urls_are_documented_on_a_multi_date_server_only(crops_server, flood_server):
    for server, frames in ((crops_server, 3), (flood_server, 1)):
        listed = httpx.get(f"{server.base}/v1/scenes", headers=AUTH, timeout=60).json()
        assert listed["frames"] == frames
        create = httpx.get(f"{server.base}/openapi.json", timeout=60).json()["paths"]["/v1/scenes"]["post"]
        content = create["requestBody"]["content"]
        assert ("multipart/form-data" in content) == (frames > 1)
        json_body = content["application/json"]["schema"]  # a one-date model's by url alone
        assert (json_body.get("required") == ["url"]) == (frames == 1), json_body
    files = httpx.get(f"{crops_server.base}/openapi.json", timeout=60).json()[
        "paths"]["/v1/scenes"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]["properties"]["files"]
    assert (files["minItems"], files["maxItems"], files["items"]["format"]) == (3, 3, "binary")


def raw(server, path, **query):
    return httpx.post(f"{server.base}/v1/pool", params=query, content=path.read_bytes(), headers=TIFF, timeout=120)


def scenes(server, body):
    return httpx.post(f"{server.base}/v1/scenes", json=body, headers=AUTH, timeout=60)


@pytest.mark.parametrize("send, status, param, fragments", [
    (lambda s: pooling(s, [p.name for p in DATES[:2]], "path"), 400, "data.data",
     ["data.data: 2 dates given (crops_sample_date1.tif, crops_sample_date2.tif) but the model takes 3"]),
    (lambda s: pooling(s, [DATES[0].name, "date2_moved.tif", DATES[2].name], "path"), 400, "data.data[1]",
     ["data.data[1]: date 2 is on another grid than date 1 (data.data[0])", "resample"]),
    (lambda s: pooling(s, [b64(DATES[0]), "bm90IGEgdGlmZg==", b64(DATES[2])], "b64_json"), 400, "data.data[1]",
     ["data.data[1]: "]),
    (lambda s: pooling(s, [p.name for p in DATES], "path", date="2023-04-15"), 400, "data.date",
     ["data.date: the model takes 3 dates"]),
    (lambda s: pooling(s, DATES[0].name, "path"), 400, "data.data",
     ["data.data: has 6 bands, but a stacked file for this model holds 3 dates x 6 bands"]),
    (lambda s: pooling(s, DATES[0].name, "path", indices=[0, 1, 2, 3, 4, 5]), 400, "data.indices",
     ["data.indices: picks bands of each date of a list"]),
    (lambda s: raw(s, DATES[0]), 400, "body", ["body: has 6 bands, but a stacked file"]),
    (lambda s: raw(s, STACKED, date="2023-04-15,2023-07-01"), 400, "date", ["date: 2 dates given"]),
    (lambda s: httpx.post(f"{s.base}/v1/pool", files=[("file", p.read_bytes()) for p in DATES], headers=AUTH),
     415, None, ["one stacked GeoTIFF of the model's 3 dates", "/pooling's data.data, /v1/scenes' urls"]),
    (lambda s: scenes(s, {"urls": ["https://example.com/a.tif", "https://example.com/b.tif"]}), 400, "urls",
     ["urls: 2 dates given (https://example.com/a.tif, https://example.com/b.tif) but the model takes 3"]),
    (lambda s: scenes(s, {"urls": ["https://example.com/a.tif"] * 2 + ["file:///etc/passwd"]}), 400, "urls[2]",
     ["urls[2]: file:///etc/passwd is not an http(s) URL"]),
    (lambda s: scenes(s, {"url": "https://example.com/a.tif", "date": ["2023-04-15"]}), 400, "date",
     ["date: 1 dates given but the model takes 3"]),
])
def test_bad_multidate_requests_name_the_field(crops_server, send, status, param, fragments):
    response = send(crops_server)
    assert response.status_code == status, response.text
    body = error(response)
    assert body["param"] == param, body
    for fragment in fragments:
        assert fragment in body["message"], body
    assert str(crops_server.base) not in body["message"] and "/tmp" not in body["message"], body


@pytest.mark.parametrize("send, param, fragment", [
    (lambda s: httpx.post(f"{s.base}/pooling", headers=AUTH, timeout=60, json={"model": "flood", "data": {
        "data": [b64(DATES[0])] * 3, "data_format": "b64_json"}}), "data.data", "a list of per-band files takes"),
    (lambda s: httpx.post(f"{s.base}/pooling", headers=AUTH, timeout=60, json={"model": "flood", "data": {
        "data": "scene.tif", "data_format": "path", "date": WHEN}}), "data.date",
     "data.date: 3 dates given but the model takes one acquisition"),
    (lambda s: httpx.post(f"{s.base}/v1/scenes", headers=AUTH, timeout=60, json={"urls": ["https://h/a.tif"] * 3}),
     "urls", "urls: lists the dates of a multi-date model; this model takes one date"),
    (lambda s: httpx.post(f"{s.base}/v1/pool", params=[("date", d) for d in WHEN], headers=TIFF, timeout=60,
                          content=b"II*\0"), "date", "date: 3 dates given but the model takes one acquisition"),
    (lambda s: httpx.post(f"{s.base}/v1/scenes", files=form(DATES), headers=AUTH, timeout=60), "body",
     "this model takes one date: post the GeoTIFF itself as the body"),
])
def test_dates_sent_to_a_one_date_server_are_refused(flood_server, send, param, fragment):
    response = send(flood_server)
    assert response.status_code == 400, response.text
    body = error(response)
    assert body["param"] == param and fragment in body["message"], body


def test_the_served_map_is_the_models_classes(offline):
    """The reference itself is a crop map (not an empty or constant mask the routes could also match)."""
    with rasterio.open(offline) as ds:
        classes = np.unique(ds.read(1))
    assert len(set(classes) - {255}) >= 5, classes


def test_a_url_date_on_another_grid_names_its_place_in_the_list(crops_server, media):
    """An error about a URL carries no param of its own: the date it is about gives it (`data.data[1]`)."""
    with RangeServer(media) as source:
        urls = [f"{source.url}/{name}" for name in (DATES[0].name, "date2_moved.tif", DATES[2].name)]
        response = pooling(crops_server, urls, "url")
    assert response.status_code == 400, response.text
    body = error(response)
    assert body["param"] == "data.data[1]", body
    assert body["message"].startswith(f"{urls[1]}: date 2 is on another grid than date 1 ({urls[0]})"), body
