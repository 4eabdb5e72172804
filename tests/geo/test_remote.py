"""Remote scenes with no network: a loopback HTTP server (started here on 127.0.0.1, range requests,
counting the bytes it sends) serves HLS-like per-band COGs and a STAC item. The mask must equal the one
made from the same bands as a local multi-band file; an area of interest fetches a fraction of the
files; bad remote inputs fail with one clear error and leave no output."""
import json

import pytest
import rasterio

from appliance.errors import InputError
from tests.geo.conftest import make_cfg, run_geo, synthetic
from tests.geo.hls import RangeServer, file_sizes, masks_equal, split_bands, stac_item


@pytest.fixture
def hls(scene, tmp_path):
    """(per-band COGs in tmp/hls, an item.json there with relative hrefs, the multi-band mask)."""
    path, _ = scene
    files = split_bands(path, tmp_path / "hls")
    stac_item(tmp_path / "hls" / "item.json", [f.name for f in files])
    reference = tmp_path / "ref.tif"
    run_geo(str(path), reference)
    return files, reference


def test_stac_item_over_http_makes_the_local_mask(hls, tmp_path):
    files, reference = hls
    with RangeServer(tmp_path / "hls") as server:
        records = run_geo(f"{server.url}/item.json", tmp_path / "out")
        sent = dict(server.sent)
    out = tmp_path / "out" / "item.mask.tif"
    assert records[0]["output_path"] == str(out)
    assert masks_equal(out, reference)
    assert set(sent) == {"item.json"} | {f.name for f in files}
    item = json.loads((tmp_path / "out" / "item.mask.stac.json").read_text())
    assert [link["href"] for link in item["links"] if link["rel"] == "derived_from"] == [f"{server.url}/item.json"]


def test_per_band_urls_and_a_remote_multi_band_file(hls, scene, tmp_path):
    files, reference = hls
    path, _ = scene
    (tmp_path / "hls" / "scene.tif").write_bytes(path.read_bytes())
    with RangeServer(tmp_path / "hls") as server:
        run_geo([[f"{server.url}/{f.name}" for f in files]], tmp_path / "bands.tif")
        run_geo(f"{server.url}/scene.tif", tmp_path / "multi.tif")
    assert masks_equal(tmp_path / "bands.tif", reference)
    assert masks_equal(tmp_path / "multi.tif", reference)


def test_quarter_of_a_large_scene_fetches_a_fraction_of_it(tmp_path):
    scene = tmp_path / "big.tif"
    synthetic.write_scene(scene, 1024, 1024, seed=5)
    files = split_bands(scene, tmp_path / "hls", block=256)
    stac_item(tmp_path / "hls" / "item.json", [f.name for f in files])
    with rasterio.open(scene) as ds:
        west, south, east, north = rasterio.warp.transform_bounds(ds.crs, "EPSG:4326", *ds.bounds)
    quarter = [west, south, west + (east - west) / 2, south + (north - south) / 2]  # the south-west quarter
    pipeline_cfg = make_cfg(tile_size=256, overlap=32)
    from appliance.stages.build import build_pipeline

    pipeline = build_pipeline(pipeline_cfg)
    with RangeServer(tmp_path / "hls") as server:
        records = list(pipeline.run([{"input": f"{server.url}/item.json", "output": str(tmp_path / "q.tif"),
                                      "overwrite": False, "aoi": quarter}]))
        sent = server.total_sent() - server.sent["item.json"]
    pipeline.close()
    with rasterio.open(tmp_path / "q.tif") as ds:
        assert 500 <= ds.width <= 530 and 500 <= ds.height <= 530  # lon/lat box around the UTM quarter
    whole = file_sizes(files)
    assert sent < 0.4 * whole, (sent, whole)  # a quarter of the pixels, plus headers and edge blocks
    assert records[0]["display"].startswith(f"wrote {tmp_path / 'q.tif'}: ")


def test_non_cog_over_http_works(scene, tmp_path):
    """A striped (not tiled) GeoTIFF still reads by ranges, whole strips at a time: slower, same mask."""
    path, _ = scene
    files = split_bands(path, tmp_path / "plain", cog=False)
    with rasterio.open(files[0]) as ds:
        assert not ds.profile.get("tiled")
    with RangeServer(tmp_path / "plain") as server:
        run_geo([[f"{server.url}/{f.name}" for f in files]], tmp_path / "m.tif")
    reference = tmp_path / "ref.tif"
    run_geo(str(path), reference)
    assert masks_equal(tmp_path / "m.tif", reference)


def test_server_without_range_support_is_refused_clearly(hls, tmp_path):
    files, _ = hls
    with RangeServer(tmp_path / "hls", ranges=False) as server:
        with pytest.raises(InputError, match=r"B02.tif: cannot be opened \(Range downloading not supported"):
            run_geo([[f"{server.url}/{f.name}" for f in files]], tmp_path / "m.tif")
    assert not (tmp_path / "m.tif").exists()


def test_unreachable_asset_is_one_clear_error_and_no_output(hls, tmp_path):
    files, _ = hls
    (tmp_path / "hls" / files[4].name).unlink()  # the item lists B11, the server answers 404
    out = tmp_path / "out"
    with RangeServer(tmp_path / "hls") as server:
        with pytest.raises(InputError, match=rf"asset B11 \({server.url}/.*B11.tif\): cannot be opened \("):
            run_geo(f"{server.url}/item.json", out)
        with pytest.raises(InputError, match=r"the STAC item could not be fetched \(HTTP 404\)"):
            run_geo(f"{server.url}/missing.json", out)
    assert not out.exists() or list(out.iterdir()) == []


def test_closed_port_and_signed_url_query_never_shown(tmp_path):
    with RangeServer(tmp_path) as server:
        url = server.url
    with pytest.raises(InputError) as error:  # the server is gone: nothing listens there now
        run_geo(f"{url}/B02.tif?X-Amz-Signature=secret", tmp_path / "m.tif")
    assert f"{url}/B02.tif: cannot be opened" in str(error.value) and "secret" not in str(error.value)


def test_remote_input_needs_an_output(hls, tmp_path):
    with pytest.raises(InputError, match=r"output: http://127.0.0.1:1/item.json is remote"):
        run_geo("http://127.0.0.1:1/item.json?token=x")
