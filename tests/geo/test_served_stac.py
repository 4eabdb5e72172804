"""`appliance serve`: a STAC item URL in `/pooling` is read band by band, a window at a time, through the
SSRF-safe fetcher (remote_file.py), never GDAL's own HTTP client: the mask equals `appliance run`'s on
the multi-band sample; redirects are re-checked on every range request."""
import base64

import httpx
import numpy as np
import pytest
import rasterio

from appliance.errors import InputError
from appliance.fetch import FetchPolicy
from appliance.stages.geo.remote_file import CHUNK_BYTES, RangeFile, RemoteReads
from tests.conftest import run_cli
from tests.fetch.conftest import wait_for
from tests.geo.hls import RangeServer, split_bands, stac_item
from tests.servers import API_KEY, SAMPLE_SCENE, error

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def pooling(server, url):
    body = {"model": "flood", "data": {"data": url, "data_format": "url", "out_data_format": "b64_json",
                                       "image_format": "tiff"}}
    return httpx.post(f"{server.base}/pooling", json=body, headers=AUTH, timeout=120)


@pytest.fixture(scope="module")
def hls_sample(tmp_path_factory):
    root = tmp_path_factory.mktemp("hls_sample")
    files = split_bands(SAMPLE_SCENE, root)
    stac_item(root / "item.json", [f.name for f in files])
    out = root / "offline.tif"
    result = run_cli("run", "pipeline=prithvi_flood", f"input={SAMPLE_SCENE}", f"output={out}")
    assert result.returncode == 0, result.stderr
    return root, files, out


def test_stac_item_url_through_the_server_equals_appliance_run(flood_server, hls_sample, tmp_path):
    root, files, offline = hls_sample
    with RangeServer(root) as source:
        response = pooling(flood_server, f"{source.url}/item.json")
        assert response.status_code == 200, response.text
        assert set(source.sent) == {"item.json"} | {f.name for f in files}
    (tmp_path / "m.tif").write_bytes(base64.b64decode(response.json()["data"]["data"]))
    with rasterio.open(tmp_path / "m.tif") as got, rasterio.open(offline) as expected:
        assert np.array_equal(got.read(), expected.read())
        assert (got.crs, got.transform, got.nodata) == (expected.crs, expected.transform, expected.nodata)


def test_asset_redirected_to_a_refused_host_is_a_400(flood_server, hls_sample):
    root, files, _ = hls_sample
    with RangeServer(root) as source:
        port = source.url.rsplit(":", 1)[1]
        # localhost is loopback and not in allowed_media_domains (only 127.0.0.1 is)
        source.redirects[f"/{files[2].name}"] = f"http://localhost:{port}/{files[2].name}"
        response = pooling(flood_server, f"{source.url}/item.json")
    assert response.status_code == 400, response.text
    body = error(response)
    assert body["param"] == "data.data" and "redirected from 127.0.0.1" in body["message"], body
    assert "allowed_media_domains" in body["message"] and "Traceback" not in body["message"]


def test_item_naming_a_server_file_is_refused(flood_server, hls_sample, tmp_path):
    root, files, _ = hls_sample
    stac_item(root / "local.json", [str(files[0])] + [f.name for f in files[1:]])  # an absolute local path
    with RangeServer(root) as source:
        response = pooling(flood_server, f"{source.url}/local.json")
    assert response.status_code == 400 and "is not an http(s) URL" in error(response)["message"], response.text


def test_range_file_reads_what_it_is_asked_and_honours_the_policy(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, 3 * CHUNK_BYTES + 100, dtype=np.uint8).tobytes()
    (tmp_path / "big.bin").write_bytes(data)
    local = FetchPolicy(allowed_domains=("127.0.0.1",), max_bytes=1 << 30, total_timeout_s=30)
    with RangeServer(tmp_path) as source:
        url = f"{source.url}/big.bin"
        reads = RemoteReads(local, "data.data")
        f = RangeFile(url, reads)
        f.seek(len(data) - 10)
        assert f.read(100) == data[-10:] and f.read(5) == b""
        f.seek(5)
        assert f.read(CHUNK_BYTES) == data[5:CHUNK_BYTES + 5]  # across two chunks
        sent = source.total_sent()
        again = RangeFile(url, reads)  # GDAL opens a file again to read it: its chunks are kept
        assert again.read(CHUNK_BYTES + 5) == data[:CHUNK_BYTES + 5] and source.total_sent() == sent
        with pytest.raises(InputError, match="resolves to 127.0.0.1, a loopback address"):
            RangeFile(url, RemoteReads(FetchPolicy(max_bytes=1 << 20, total_timeout_s=30), "data.data"))
        # max_media_bytes bounds all the request's reads of a file, not each range
        capped = RangeFile(url, RemoteReads(FetchPolicy(allowed_domains=("127.0.0.1",), max_bytes=CHUNK_BYTES + 1,
                                                        total_timeout_s=30),
                                            "data.data"))
        capped.seek(2 * CHUNK_BYTES)
        with pytest.raises(InputError, match=f"more than {CHUNK_BYTES + 1} bytes"):
            capped.read(10)


def test_range_file_reads_ahead_only_when_reading_in_file_order(tmp_path):
    data = np.random.default_rng(1).integers(0, 256, 40 * CHUNK_BYTES, dtype=np.uint8).tobytes()
    (tmp_path / "blocks.bin").write_bytes(data)
    local = FetchPolicy(allowed_domains=("127.0.0.1",), max_bytes=1 << 30, total_timeout_s=30)
    block = CHUNK_BYTES + 1000  # a COG block: a little over a chunk, read by one call each
    with RangeServer(tmp_path) as source:
        url = f"{source.url}/blocks.bin"
        f = RangeFile(url, RemoteReads(local, "data.data"))
        gets = source.requests  # the size probe
        for offset in range(0, 20 * block, block):  # a row of blocks, in file order
            f.seek(offset)
            assert f.read(block) == data[offset:offset + block]
        sequential = source.requests - gets
        assert sequential <= 8, sequential  # 1, 2, 4, 8, 8 ... chunks ahead: not one GET a block

    with RangeServer(tmp_path) as source:  # a fresh server: its counters are this file's alone
        g = RangeFile(f"{source.url}/blocks.bin", RemoteReads(local, "data.data"))
        for offset in (30 * CHUNK_BYTES, 22 * CHUNK_BYTES, 36 * CHUNK_BYTES):  # out of order: nothing extra
            g.seek(offset)
            assert g.read(100) == data[offset:offset + 100]
        assert wait_for(lambda: source.requests == 4)  # counted after each body is sent
        assert source.total_sent() == 4 * CHUNK_BYTES  # the size probe's chunk, then one chunk each
