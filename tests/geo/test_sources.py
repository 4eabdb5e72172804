"""Scenes as users have them, on local disk: per-band files, a STAC item, an area of interest. Each mask
must equal the one made from the same bands as one multi-band file (or its window, for an aoi)."""
import json

import numpy as np
import pytest
import rasterio
from rasterio.warp import transform_bounds

from appliance.errors import InputError
from appliance.stages.geo.aoi import Aoi, aoi_window, parse_aoi
from tests.geo.conftest import run_geo
from tests.geo.hls import masks_equal, split_bands, stac_item


@pytest.fixture
def bands(scene, tmp_path):
    """(multi-band scene, its per-band COGs, the multi-band file's mask)."""
    path, _ = scene
    files = split_bands(path, tmp_path / "hls")
    reference = tmp_path / "ref" / "m.tif"
    run_geo(str(path), reference)
    return path, files, reference


def test_per_band_files_make_the_multi_band_mask(bands, tmp_path):
    _, files, reference = bands
    out = tmp_path / "out"
    records = run_geo([[str(f) for f in files]], out)
    assert records[0]["output_path"] == str(out / "HLS.S30.T15RYP.2024100T165849.v2.0.B02.mask.tif")
    assert masks_equal(records[0]["output_path"], reference)
    item = json.loads((out / "HLS.S30.T15RYP.2024100T165849.v2.0.B02.mask.stac.json").read_text())
    hrefs = [link["href"] for link in item["links"] if link["rel"] == "derived_from"]
    assert hrefs == [f"../hls/{f.name}" for f in files]  # relative to the item in out/


def test_stac_item_with_relative_hrefs_makes_the_same_mask(bands, tmp_path):
    _, files, reference = bands
    item = stac_item(tmp_path / "hls" / "item.json", [f.name for f in files])
    records = run_geo(str(item), tmp_path / "m.tif")
    assert masks_equal(tmp_path / "m.tif", reference)
    assert records[0]["scene"].labels[3].startswith("asset B8A (")
    out_item = json.loads((tmp_path / "m.stac.json").read_text())
    assert out_item["properties"]["datetime"] == "2024-04-09T16:58:49Z"
    assert [link["href"] for link in out_item["links"] if link["rel"] == "derived_from"] == ["hls/item.json"]


def test_item_without_a_band_names_the_missing_band(bands, tmp_path):
    _, files, _ = bands
    item = stac_item(tmp_path / "item.json", [str(f) for f in files[:4]])  # no swir16, swir22
    with pytest.raises(InputError, match=r"item.json: has no asset for band\(s\) swir16, swir22 "
                                         r".*its assets: B02 \(blue\), .*B8A \(nir08\), Fmask"):
        run_geo(str(item), tmp_path / "m.tif")
    assert not (tmp_path / "m.tif").exists()


def test_band_on_another_grid_is_refused_by_name(bands, tmp_path):
    path, files, _ = bands
    coarse = tmp_path / "coarse.tif"
    with rasterio.open(files[4]) as src:
        profile = {**src.profile, "driver": "GTiff", "width": src.width // 2, "height": src.height // 2,
                   "transform": src.transform @ src.transform.scale(2, 2)}
        data = src.read(1)[::2, ::2]
    with rasterio.open(coarse, "w", **profile) as dst:
        dst.write(data, 1)
    item = stac_item(tmp_path / "item.json", [str(f) for f in files[:4]] + [str(coarse), str(files[5])])
    with pytest.raises(InputError, match=r"asset B11 \(.*coarse.tif\): is on a different grid from asset B02 .*"
                                         r"200x150 px of 60x60 .* vs 400x300 px of 30x30"):
        run_geo(str(item), tmp_path / "m.tif")
    with pytest.raises(InputError, match=r"coarse.tif: is on a different grid from .*B02.tif"):
        run_geo([[str(f) for f in files[:4]] + [str(coarse), str(files[5])]], tmp_path / "m.tif")


def test_per_band_list_of_the_wrong_length(bands, tmp_path):
    _, files, _ = bands
    with pytest.raises(InputError, match="input: 5 per-band files given but the model takes 6 bands"):
        run_geo([[str(f) for f in files[:5]]], tmp_path / "m.tif")


def test_multi_band_file_in_a_per_band_list_is_refused(bands, tmp_path):
    path, files, _ = bands
    with pytest.raises(InputError, match=r"scene.tif: has 6 bands; a per-band input is one single-band file"):
        run_geo([[str(path)] + [str(f) for f in files[1:]]], tmp_path / "m.tif")


def test_aoi_mask_is_the_window_of_the_whole_mask(bands, tmp_path):
    path, _, reference = bands
    with rasterio.open(path) as ds:
        transform, crs = ds.transform, ds.crs
    # pixel rows 40..159, columns 100..249 as a UTM box, then as lon/lat (the default)
    x0, y0 = transform @ (100, 160)
    x1, y1 = transform @ (250, 40)
    utm = [x0 + 1, y0 + 1, x1 - 1, y1 - 1]
    records = run_geo_aoi(path, tmp_path / "utm.tif", utm, str(crs))
    assert records[0]["display"].startswith(f"wrote {tmp_path / 'utm.tif'}: 150x120, ")
    with rasterio.open(tmp_path / "utm.tif") as ds, rasterio.open(reference) as whole:
        assert ds.transform == transform @ transform.translation(100, 40) and ds.crs == crs
        assert np.array_equal(ds.read(1), whole.read(1)[40:160, 100:250])
    lonlat = transform_bounds(crs, "EPSG:4326", *utm)
    run_geo_aoi(path, tmp_path / "ll.tif", list(lonlat))
    with rasterio.open(tmp_path / "ll.tif") as ds:  # the lon/lat box contains the UTM box: a bit larger
        assert 150 <= ds.width <= 160 and 120 <= ds.height <= 130


def run_geo_aoi(path, output, aoi, aoi_crs=None):
    from appliance.stages.build import build_pipeline
    from tests.geo.conftest import make_cfg

    pipeline = build_pipeline(make_cfg())
    pipeline.setup()
    try:
        return list(pipeline.run([{"input": str(path), "output": str(output), "overwrite": False,
                                   "aoi": aoi, "aoi_crs": aoi_crs}]))
    finally:
        pipeline.close()


@pytest.mark.parametrize("aoi, crs, message", [
    ([1, 2, 3], None, r"aoi: expected \[xmin, ymin, xmax, ymax\]"),
    ([3, 2, 1, 4], None, r"aoi: .* has xmin > xmax"),
    ("1 2 3 x", None, r"aoi: expected"),
    ([0, 0, 1, 1], "EPSG:nope", "aoi_crs: 'EPSG:nope' is not a coordinate reference system"),
])
def test_bad_aoi(aoi, crs, message):
    with pytest.raises(InputError, match=message):
        parse_aoi(aoi, crs)


def test_aoi_outside_the_scene_says_where_the_scene_is(scene, tmp_path):
    path, _ = scene
    with pytest.raises(InputError, match=r"aoi: \[10,10,11,11\] \(EPSG:4326\) does not overlap .*scene.tif, "
                                         r"which covers \["):
        run_geo_aoi(path, tmp_path / "m.tif", [10, 10, 11, 11])
    assert not (tmp_path / "m.tif").exists()


@pytest.mark.parametrize("bounds, expected", [
    ((0, -300, 300, 0), (0, 0, 10, 10)),          # on pixel edges: exactly 10x10
    ((15, -45, 45, -15), (0, 0, 2, 2)),           # inside pixels: widened to whole pixels
    ((-100, -100, 45, 100), (0, 0, 4, 2)),        # clipped to the scene
    ((2970, -2970, 4000, -2900), (96, 99, 3, 1)),  # the right edge, rows 96.7..99
])
def test_aoi_window_table(bounds, expected):
    from affine import Affine

    assert aoi_window(Aoi(bounds, "EPSG:32615"), rasterio.crs.CRS.from_epsg(32615), Affine(30, 0, 0, 0, -30, 0),
                      100, 100, "s.tif") == expected
