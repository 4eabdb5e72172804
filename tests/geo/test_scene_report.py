"""The scene report (stages/geo/scene_report.py): a written mask's summary, checked against numpy's count
of the mask and closed-form areas, its two previews (scene.png, mask.png), and the stretch scene.png used."""
import json
import math

import numpy as np
import pytest
import rasterio
from affine import Affine
from PIL import Image
from rasterio.enums import Resampling
from rasterio.warp import transform as warp_transform

from appliance.stages.geo import scene_report
from appliance.stages.geo.class_colours import NODATA_GREY, default_colours
from appliance.stages.geo.quicklook import stretched
from appliance.stages.geo.scene_report import class_summary, grid_summary, write_scene_report
from tests.geo.conftest import run_geo

R = 6371008.8


def numpy_counts(mask, count):
    """(pixels per class, nodata pixels) of a mask [B, H, W] read whole."""
    if mask.dtype == np.uint8:
        classes, nodata = mask[0], mask[0] == 255
    else:
        nodata = np.isnan(mask).any(axis=0)
        classes = np.nan_to_num(mask).argmax(axis=0)
    return [int(((classes == i) & ~nodata).sum()) for i in range(count)], int(nodata.sum())


def write_mask(path, data, crs, transform, nodata, block=16):
    with rasterio.open(path, "w", driver="GTiff", width=data.shape[2], height=data.shape[1], count=data.shape[0],
                       dtype=data.dtype, crs=crs, transform=transform, nodata=nodata, tiled=True,
                       blockxsize=block, blockysize=block) as dst:
        dst.write(data)
    return path


@pytest.mark.parametrize("output", ["classes", "probabilities"])
def test_report_of_a_written_mask(scene, tmp_path, output):
    path, _ = scene
    mask_path = tmp_path / "m.tif"
    (record,) = run_geo(str(path), mask_path, stitch={"output": output})
    report = tmp_path / "report"
    report.mkdir()
    summary = write_scene_report(record["scene"], str(mask_path), str(report), preview_size=200)

    with rasterio.open(mask_path) as ds:
        mask = ds.read()
        assert (summary["width"], summary["height"]) == (ds.width, ds.height) == (400, 300)
        assert summary["crs"] == ds.crs.to_string() == "EPSG:32615"
        assert summary["bounds"] == list(ds.bounds)
        assert Affine(*summary["transform"]) == ds.transform
    assert mask.dtype == (np.uint8 if output == "classes" else np.float32)
    pixels, nodata = numpy_counts(mask, 2)
    assert nodata > 0 and min(pixels) > 0  # the synthetic scene has gaps, land and water
    assert [c["pixels"] for c in summary["classes"]] == pixels
    assert summary["valid_pixels"] == sum(pixels) and summary["nodata_pixels"] == nodata
    assert [c["name"] for c in summary["classes"]] == ["land", "water"]
    assert [tuple(c["colour"]) for c in summary["classes"]] == default_colours(2)
    assert summary["pixel_area_m2"] == pytest.approx(900.0)  # 30 m UTM pixels
    for cls, count in zip(summary["classes"], pixels):
        assert cls["area_km2"] == pytest.approx(count * 900.0 / 1e6)
        assert cls["share"] == pytest.approx(count / sum(pixels))
    assert summary["nodata_colour"] == list(NODATA_GREY)

    assert summary["preview"] == {"width": 200, "height": 150}
    with Image.open(report / "scene.png") as picture:
        assert picture.mode == "RGB" and picture.size == (200, 150)
        scene_pixels = np.asarray(picture)
    with Image.open(report / "mask.png") as image:
        assert image.mode == "P" and image.size == (200, 150) and image.info["transparency"] == 0
        palette = image.getpalette()[:9]
        indexes = np.asarray(image)
    assert palette == [*default_colours(2)[0], *default_colours(2)[1], *NODATA_GREY]
    assert set(np.unique(indexes)) == {0, 1, 2}
    gaps = indexes == 2  # nodata: grey in the scene picture too
    assert (scene_pixels[gaps] == NODATA_GREY).all() and not (scene_pixels[~gaps] == NODATA_GREY).all(axis=1).all()

    # scene_rgb.json: the files, bands and stretch scene.png shows, which the map's scene tiles reuse
    rendering = json.loads((report / "scene_rgb.json").read_text())
    assert rendering["files"] == [str(path)] * 3 and rendering["bands"] == [3, 2, 1]  # RED, GREEN, BLUE
    with rasterio.open(path) as ds:
        dn = ds.read(rendering["bands"], out_shape=(3, 150, 200), resampling=Resampling.nearest).astype(np.float32)
    assert np.array_equal(stretched(dn, rendering["ranges"]).transpose(1, 2, 0)[~gaps], scene_pixels[~gaps])


def test_lonlat_grid_and_bounds_follow_the_pixel_grid(scene, tmp_path):
    path, _ = scene
    mask_path = tmp_path / "m.tif"
    run_geo(str(path), mask_path)
    with rasterio.open(mask_path) as ds:
        summary = grid_summary(ds)
        grid = summary["lonlat_grid"]
        assert grid["size"] == 9 and len(grid["lon"]) == 9 and all(len(row) == 9 for row in grid["lat"])
        corners = {(0, 0): (0, 0), (0, 8): (0, ds.width), (8, 0): (ds.height, 0), (8, 8): (ds.height, ds.width)}
        for (i, j), (row, col) in corners.items():
            x, y = ds.transform @ (col, row)
            (lon,), (lat,) = warp_transform(ds.crs, "EPSG:4326", [x], [y])
            assert (grid["lon"][i][j], grid["lat"][i][j]) == pytest.approx((lon, lat))
        x, y = ds.transform @ (ds.width / 2, ds.height / 2)  # the middle point
        (lon,), (lat,) = warp_transform(ds.crs, "EPSG:4326", [x], [y])
        assert (grid["lon"][4][4], grid["lat"][4][4]) == pytest.approx((lon, lat))
    west, south, east, north = summary["lonlat_bounds"]
    lons, lats = np.asarray(grid["lon"]), np.asarray(grid["lat"])
    assert west <= lons.min() < lons.max() <= east and south <= lats.min() < lats.max() <= north


def test_geographic_areas_on_the_sphere(tmp_path):
    """1 x 1 degree at 50-51 N: water in the northern half, land in the southern, one nodata row at the
    top: each half's area is the spherical zone's, R^2 dlon (sin(top) - sin(bottom))."""
    data = np.zeros((1, 100, 100), dtype=np.uint8)
    data[0, :50] = 1
    data[0, 0] = 255
    grid = Affine(0.01, 0, 10.0, 0, -0.01, 51.0)
    with rasterio.open(write_mask(tmp_path / "geo.tif", data, "EPSG:4326", grid, 255)) as ds:
        summary = class_summary(ds, ["land", "water"])

    def zone_km2(south, north):
        return R ** 2 * math.radians(1.0) * (math.sin(math.radians(north)) - math.sin(math.radians(south))) / 1e6

    land, water = summary["classes"]
    assert summary["pixel_area_m2"] is None
    assert land["area_km2"] == pytest.approx(zone_km2(50.0, 50.5), rel=1e-9)
    assert water["area_km2"] == pytest.approx(zone_km2(50.5, 50.99), rel=1e-9)
    assert (land["pixels"], water["pixels"], summary["nodata_pixels"]) == (5000, 4900, 100)


def test_rotated_geographic_grid_has_no_area(tmp_path):
    data = np.zeros((1, 16, 16), dtype=np.uint8)
    grid = Affine(0.01, 0.001, 10.0, 0.001, -0.01, 51.0)
    with rasterio.open(write_mask(tmp_path / "rot.tif", data, "EPSG:4326", grid, 255)) as ds:
        summary = class_summary(ds, ["land", "water"])
    assert [c["area_km2"] for c in summary["classes"]] == [None, None] and summary["classes"][0]["pixels"] == 256


@pytest.mark.parametrize("crs, metres_per_unit", [("EPSG:32633", 1.0), ("EPSG:2263", 0.3048006096012192)])
def test_projected_area_in_the_crs_units(tmp_path, crs, metres_per_unit):
    data = np.zeros((1, 32, 48), dtype=np.uint8)
    data[0, :, :10] = 1
    grid = Affine(10.0, 0, 1000.0, 0, -20.0, 5000.0)
    with rasterio.open(write_mask(tmp_path / "p.tif", data, crs, grid, 255)) as ds:
        summary = class_summary(ds, ["land", "water"])
    pixel = 200.0 * metres_per_unit ** 2
    assert summary["pixel_area_m2"] == pytest.approx(pixel)
    assert summary["classes"][1]["area_km2"] == pytest.approx(320 * pixel / 1e6)
    assert summary["classes"][0]["area_km2"] == pytest.approx((32 * 48 - 320) * pixel / 1e6)


@pytest.mark.parametrize("dtype", ["uint8", "float32"])
def test_counted_by_strips_as_the_whole_mask(tmp_path, monkeypatch, dtype):
    """A strip budget of a few rows makes many strips; the counts equal numpy's over the whole mask."""
    rng = np.random.default_rng(7)
    if dtype == "uint8":
        data = rng.integers(0, 3, (1, 100, 70)).astype(np.uint8)
        data[data == 2] = 255
        nodata = 255
    else:
        data = rng.random((3, 100, 70)).astype(np.float32)
        data[:, rng.random((100, 70)) < 0.1] = np.nan
        nodata = float("nan")
    names = ["a", "b"] if dtype == "uint8" else ["a", "b", "c"]
    monkeypatch.setattr(scene_report, "STRIP_BYTES", 70 * data.shape[0] * data.itemsize * 16)
    with rasterio.open(write_mask(tmp_path / "s.tif", data, "EPSG:32633", Affine(10, 0, 0, 0, -10, 0), nodata)) as ds:
        assert len(scene_report.strips(ds)) == 7  # 16-row strips over 100 rows
        summary = class_summary(ds, names)
    pixels, missing = numpy_counts(data, len(names))
    assert [c["pixels"] for c in summary["classes"]] == pixels and summary["nodata_pixels"] == missing
    assert summary["valid_pixels"] + missing == 100 * 70


def test_previews_are_never_upscaled(scene, tmp_path):
    path, _ = scene
    (record,) = run_geo(str(path), tmp_path / "m.tif")
    summary = write_scene_report(record["scene"], str(tmp_path / "m.tif"), str(tmp_path), preview_size=5000)
    assert summary["preview"] == {"width": 400, "height": 300}
    with Image.open(tmp_path / "mask.png") as image, rasterio.open(tmp_path / "m.tif") as ds:
        expected = ds.read(1)
        indexes = np.asarray(image)
    assert (indexes == np.where(expected == 255, 2, expected)).all()  # at full size: the mask itself
