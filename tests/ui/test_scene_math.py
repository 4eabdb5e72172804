"""The map page's arithmetic (appliance/serving/ui/static/scene_math.js), run by Node (skipped where it is
missing) on summaries built here, against rasterio: a pixel's map coordinates (a rotated transform too),
its lon/lat interpolated in the 9 x 9 grid (across the antimeridian too) and the pixel under a lon/lat,
its class from a mask colour, and the headline figures."""
import json
import shutil
import subprocess

import pytest
from affine import Affine
from rasterio.crs import CRS
from rasterio.warp import transform as warp

from appliance.serving.ui.routes import STATIC

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")
UTM = CRS.from_epsg(32615)


def call(tmp_path, calls):
    """[[function name, *arguments], ...] -> what scene_math.js returns for each."""
    module = tmp_path / "scene_math.mjs"  # .mjs: Node reads it as an ES module
    module.write_text((STATIC / "scene_math.js").read_text())
    script = (f"import * as math from {json.dumps(module.as_uri())};\n"
              f"const calls = {json.dumps(calls)};\n"
              "console.log(JSON.stringify(calls.map(([name, ...args]) => math[name](...args))));")
    done = subprocess.run([NODE, "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def grid(crs, transform, width, height, n=9):
    """lonlat_grid as the server builds it: n x n points at the pixel grid's corners."""
    lon, lat = [], []
    for i in range(n):
        points = [transform @ (j * width / (n - 1), i * height / (n - 1)) for j in range(n)]
        lons, lats = warp(crs, "EPSG:4326", [p[0] for p in points], [p[1] for p in points])
        lon.append(lons)
        lat.append(lats)
    return {"size": n, "lon": lon, "lat": lat}


def summary(classes, **fields):
    transform = fields.pop("transform", Affine(30, 0, 500000, 0, -30, 3300000))
    crs = fields.pop("crs", UTM)
    width, height = fields.pop("width", 400), fields.pop("height", 300)
    return {"width": width, "height": height, "transform": list(transform)[:6], "crs": crs.to_string(),
            "lonlat_grid": grid(crs, transform, width, height), "classes": classes,
            "nodata_colour": [60, 60, 60], **fields}


def entry(index, name, colour, pixels, area_km2):
    return {"index": index, "name": name, "colour": colour, "pixels": pixels, "area_km2": area_km2}


FLOOD = [entry(0, "land", [200, 200, 200], 700, 0.63), entry(1, "water", [0, 90, 255], 200, 0.18)]


def test_a_pixels_map_coordinates(tmp_path):
    rotated = Affine(20, 5, 1000, 4, -20, 9000)
    (got,) = call(tmp_path, [["mapXY", list(rotated)[:6], 7, 3]])
    assert got == pytest.approx(dict(zip("xy", rotated @ (7.5, 3.5))))


@pytest.mark.parametrize("col, row", [(0, 0), (399, 299), (123, 45), (200, 150), (57, 280)])
def test_lon_lat_between_the_grid_points_is_rasterio_s(tmp_path, col, row):
    scene = summary(FLOOD)
    x, y = Affine(*scene["transform"]) @ (col + 0.5, row + 0.5)
    (lon,), (lat,) = warp(UTM, "EPSG:4326", [x], [y])
    (got,) = call(tmp_path, [["lonLat", scene, col, row]])
    assert got["lon"] == pytest.approx(lon, abs=1e-6) and got["lat"] == pytest.approx(lat, abs=1e-6)


@pytest.mark.parametrize("x, y, expected", [
    (0.3, 0.3, {"col": 0, "row": 0}), (399.7, 299.6, {"col": 399, "row": 299}), (123.2, 45.8, {"col": 123, "row": 45}),
    (200.5, 150.5, {"col": 200, "row": 150}), (-0.5, 10, None), (10, 300.5, None)])
def test_the_pixel_under_a_lon_lat_is_rasterio_s(tmp_path, x, y, expected):
    """pixelAt inverts the grid's placement: the pixel holding a point rasterio places at (x, y) of the grid."""
    scene = summary(FLOOD)
    mx, my = Affine(*scene["transform"]) @ (x, y)
    (lon,), (lat,) = warp(UTM, "EPSG:4326", [mx], [my])
    assert call(tmp_path, [["pixelAt", scene, lon, lat]]) == [expected]


def test_lon_lat_across_the_antimeridian_takes_the_short_way(tmp_path):
    # A geographic scene from 179.5 E to 179.5 W: its grid's longitudes jump from 180 to -180.
    scene = summary(FLOOD, crs=CRS.from_epsg(4326), transform=Affine(0.01, 0, 179.5, 0, -0.01, 10), width=100,
                    height=100)
    for row in scene["lonlat_grid"]["lon"]:
        row[:] = [lon - 360 if lon > 180 else lon for lon in row]
    west, middle, east = call(tmp_path, [["lonLat", scene, col, 50] for col in (0, 50, 99)])
    assert west["lon"] == pytest.approx(179.505) and east["lon"] == pytest.approx(-179.505)
    assert abs(middle["lon"]) == pytest.approx(179.995)  # not 0: the long way round
    assert middle["lat"] == pytest.approx(9.495)


def test_the_class_of_a_mask_colour(tmp_path):
    scene = summary(FLOOD)
    got = call(tmp_path, [["classOfColour", scene, [0, 0, 0, 0]], ["classOfColour", scene, [0, 90, 255, 255]],
                          ["classOfColour", scene, [60, 60, 60, 255]], ["classOfColour", scene, [2, 88, 250, 255]]])
    assert [found["name"] for found in got] == ["land", "water", "no data", "water"]


def test_headline_is_the_class_named_water_else_every_class_but_0(tmp_path):
    named = summary(FLOOD, valid_pixels=900)
    unnamed = summary([entry(0, "background", [1, 1, 1], 500, 1.0), entry(1, "river", [2, 2, 2], 300, 0.5),
                       entry(2, "lake", [3, 3, 3], 100, None)], valid_pixels=900)
    nothing = summary([entry(0, "land", [1, 1, 1], 0, 0.0), entry(1, "water", [2, 2, 2], 0, 0.0)], valid_pixels=0)
    got = call(tmp_path, [["headlineFigures", named], ["headlineFigures", unnamed], ["headlineFigures", nothing]])
    assert got[0] == {"names": ["water"], "pixels": 200, "share": pytest.approx(200 / 900), "area_km2": 0.18}
    assert got[1] == {"names": ["river", "lake"], "pixels": 400, "share": pytest.approx(400 / 900), "area_km2": None}
    assert got[2]["share"] == 0


def test_pixel_size_of_a_rotated_transform(tmp_path):
    (got,) = call(tmp_path, [["pixelSize", list(Affine(3, 4, 0, 4, -3, 0))[:6]]])
    assert got == {"x": 5, "y": 5}
