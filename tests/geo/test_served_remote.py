"""`appliance serve`: a plain GeoTIFF URL, per-band files and an area of interest in `/pooling`. A URL is
read by windows through the SSRF-safe fetcher (never downloaded whole): a small window of a large scene
fetches a fraction of the file, and every mask equals `appliance run`'s on the same local file and box.
`s3://` is read only in the buckets the server allows."""
import base64

import httpx
import pytest
import rasterio
import rasterio.shutil
from rasterio.warp import transform_bounds

from appliance.errors import InputError
from appliance.fetch import FetchPolicy
from appliance.stages.geo.scene import inspect_scene
from appliance.stages.geo.served_scenes import check_served_href, served_scene_spec
from tests.conftest import run_cli
from tests.fetch.conftest import wait_for
from tests.geo.conftest import GEO, NODATA_FILL, synthetic
from tests.geo.hls import RangeServer, masks_equal, split_bands
from tests.servers import API_KEY, error

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def pooling(server, data, data_format="url", **fields):
    body = {"model": "flood", "data": {"data": data, "data_format": data_format, "out_data_format": "b64_json",
                                       **fields}}
    return httpx.post(f"{server.base}/pooling", json=body, headers=AUTH, timeout=120)


def save_mask(response, path):
    assert response.status_code == 200, response.text
    path.write_bytes(base64.b64decode(response.json()["data"]["data"]))
    return path


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    """A 1024² six-band COG (256-pixel blocks), its bands as single-band COGs, and a lon/lat box over its
    south-west 256² corner with the mask `appliance run` makes of that box from the local file."""
    root = tmp_path_factory.mktemp("served_remote")
    draft = root / "draft.tif"
    synthetic.write_scene(draft, 1024, 1024, seed=5)
    scene = root / "scene.tif"
    rasterio.shutil.copy(draft, scene, driver="COG", COMPRESS="DEFLATE", BLOCKSIZE=256)
    bands = split_bands(draft, root / "bands", block=256)
    with rasterio.open(scene) as ds:
        left, bottom = ds.bounds.left, ds.bounds.bottom
        res = ds.res[0]
        box = transform_bounds(ds.crs, "EPSG:4326", left + 8 * res, bottom + 8 * res, left + 248 * res,
                               bottom + 248 * res)
    aoi = [round(v, 6) for v in box]
    offline = root / "offline.tif"
    result = run_cli("run", "pipeline=prithvi_flood", f"input={scene}", f"aoi=[{','.join(map(str, aoi))}]",
                     f"output={offline}")
    assert result.returncode == 0, result.stderr
    return root, scene, bands, aoi, offline


def test_a_geotiff_url_is_read_by_windows_not_whole(flood_server, large, tmp_path):
    root, scene, _, aoi, offline = large
    with RangeServer(root) as source:
        response = pooling(flood_server, f"{source.url}/scene.tif", aoi=aoi)
        sent = source.sent.get("scene.tif", 0)
    got = save_mask(response, tmp_path / "m.tif")
    assert masks_equal(got, offline)
    with rasterio.open(got) as ds:
        assert ds.width < 300 and ds.height < 300  # the box, not the scene
    size = scene.stat().st_size
    # 6 % here: the header, tile index and the box's blocks (5.5 % of pixels)
    assert 0 < sent < 0.12 * size, (sent, size)


def test_per_band_urls_with_an_aoi_equal_the_multi_band_file(flood_server, large, tmp_path):
    root, _, bands, aoi, offline = large
    with RangeServer(root) as source:
        response = pooling(flood_server, [f"{source.url}/bands/{f.name}" for f in bands], aoi=aoi)
        sent, gets, connections = source.total_sent(), source.requests, source.connections
    assert masks_equal(save_mask(response, tmp_path / "m.tif"), offline)
    assert sent < 0.2 * sum(f.stat().st_size for f in bands)  # 12 % here: six headers beside small files
    # the request's range GETs share kept-alive connections (one connection per GET before)
    assert gets >= 12 and connections <= 2, (gets, connections)


def test_per_band_paths_in_the_media_dir(flood_server, flood_dirs, large, tmp_path):
    _, _, bands, aoi, offline = large
    names = []
    for f in bands:
        (flood_dirs["media"] / f.name).write_bytes(f.read_bytes())
        names.append(f.name)
    response = pooling(flood_server, names, data_format="path", aoi=aoi)
    assert masks_equal(save_mask(response, tmp_path / "m.tif"), offline)
    three = pooling(flood_server, names[:3], data_format="path")
    assert three.status_code == 400 and error(three)["param"] == "data.data", three.text
    assert "3 per-band files given but the model takes 6 bands" in error(three)["message"]


@pytest.mark.parametrize("fields, param, fragment", [
    ({"aoi": [1, 2, 3]}, "data.aoi", "data.aoi: expected [xmin, ymin, xmax, ymax]"),
    ({"aoi": [3, 2, 1, 4]}, "data.aoi", "has xmin > xmax"),
    ({"aoi": [29.76, -92.95, 29.8, -92.9]}, "data.aoi", "did you mean [-92.95,29.76,-92.9,29.8]"),
    ({"aoi": [1, 2, 3, 4]}, "data.aoi", "data.aoi: [1,2,3,4] (EPSG:4326) does not overlap "),
    ({"aoi": [0, 0, 1, 1], "aoi_crs": "EPSG:nope"}, "data.aoi_crs", "is not a coordinate reference system"),
    ({"aoi": [10, 10, 11, 11]}, "data.aoi", "does not overlap"),
    ({"aoi": [0, 0, 1, "x"]}, "data.aoi", "(numbers)"),
])
def test_bad_aois_are_400s_naming_the_field(flood_server, large, fields, param, fragment):
    root = large[0]
    with RangeServer(root) as source:
        response = pooling(flood_server, f"{source.url}/scene.tif", **fields)
    assert response.status_code == 400, response.text
    body = error(response)
    assert body["param"] == param and fragment in body["message"], body
    assert "Traceback" not in body["message"]


def test_a_server_that_ignores_range_is_refused_not_downloaded(flood_server, large):
    root = large[0]
    with RangeServer(root, ranges=False) as source:
        response = pooling(flood_server, f"{source.url}/scene.tif")
        sent = source.total_sent()
    assert response.status_code == 400 and error(response)["param"] == "data.data", response.text
    assert "range" in error(response)["message"].lower()
    assert sent < 1 << 20  # it stopped reading: no whole download into the server


def test_s3_is_refused_unless_the_server_allows_the_bucket(flood_server):
    response = pooling(flood_server, "s3://hls/T15RYP/scene.tif")
    assert response.status_code == 400, response.text
    body = error(response)
    assert body["param"] == "data.data" and "server.allowed_s3_buckets" in body["message"], body
    listed = pooling(flood_server, ["https://example.org/B02.tif"] + ["s3://other/B.tif"] * 5)
    assert listed.status_code == 400 and "bucket 'other'" in error(listed)["message"]
    with pytest.raises(InputError, match="data.data: file:///etc/passwd is not an http"):
        check_served_href("file:///etc/passwd", "data.data", ["hls"])
    check_served_href("s3://hls/a.tif", "data.data", ["hls"])  # allowed: no error


def test_an_allowed_bucket_is_read_by_gdal_with_the_servers_credentials(large, tmp_path, monkeypatch):
    """s3:// in an allowed bucket goes to GDAL's /vsis3/ (here against a loopback endpoint, unsigned)."""
    root, scene, _, _, _ = large
    bucket = tmp_path / "hls"
    bucket.mkdir()
    (bucket / "scene.tif").write_bytes(scene.read_bytes())
    policy = FetchPolicy(allowed_domains=("127.0.0.1",), max_bytes=1 << 30, total_timeout_s=30)
    with RangeServer(tmp_path) as endpoint:
        for name, value in dict(AWS_S3_ENDPOINT=endpoint.url.split("://")[1], AWS_VIRTUAL_HOSTING="FALSE",
                                AWS_HTTPS="NO", AWS_NO_SIGN_REQUEST="YES").items():
            monkeypatch.setenv(name, value)
        spec = served_scene_spec("s3://hls/scene.tif", _geo(), policy, "data.data", ["hls"])
        info = inspect_scene(spec, 0, GEO["bands"], nodata_fill=NODATA_FILL)
        assert (info.width, info.height) == (1024, 1024)
        assert wait_for(lambda: set(endpoint.sent) == {"hls/scene.tif"})  # counted after each body is sent
        with pytest.raises(InputError, match="bucket 'hls' is not one this server reads"):
            served_scene_spec("s3://hls/scene.tif", _geo(), policy, "data.data", ["other"])


def _geo():
    from omegaconf import OmegaConf

    return OmegaConf.create(GEO)
