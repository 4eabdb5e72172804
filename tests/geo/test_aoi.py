"""Areas of interest that make no sense: each is refused in one line naming the field, and where the box
reads as [lat, lon, ...] (or upside down) the line shows the form that works; boxes that do make sense
become the scene's pixel window."""
import re

import pytest
from affine import Affine
from rasterio.crs import CRS

from appliance.errors import InputError
from appliance.stages.geo.aoi import aoi_window, parse_aoi

# The synthetic scenes' grid: 30 m UTM 15N pixels from (500000, 3300000), about lon -93, lat 29.8.
UTM = CRS.from_epsg(32615)
GRID = Affine(30, 0, 500000, 0, -30, 3300000)
SCENE = [-92.95, 29.76, -92.9, 29.8]  # lon/lat inside the scene


@pytest.mark.parametrize("aoi, crs, where, message", [
    ([1, 2, 3], None, "", r"^aoi: expected \[xmin, ymin, xmax, ymax\]"),
    ("1 2 3 x", None, "", r"^aoi: expected"),
    ([0, float("nan"), 1, 1], None, "", r"^aoi: expected .*four finite numbers"),
    ([0, 0, float("inf"), 1], None, "data.", r"^data\.aoi: expected .*four finite numbers"),
    ([1, 1, 1, 2], None, "", r"^aoi: \[1,1,1,2\] has no area"),
    ([-92.9, 29.8, -92.95, 29.76], None, "",
     r"^aoi: .* has xmin > xmax or ymin > ymax; .*did you mean aoi=\[-92\.95,29\.76,-92\.9,29\.8\]\?$"),
    ([29.76, -92.95, 29.8, -92.9], None, "",  # lat/lon swapped
     r"^aoi: \[29\.76,-92\.95,29\.8,-92\.9\] is outside lon/lat's range .*"
     r"did you mean aoi=\[-92\.95,29\.76,-92\.9,29\.8\] \(\[lon_min, lat_min, lon_max, lat_max\]\)\?$"),
    ([29.76, -92.95, 29.8, -92.9], None, "data.",  # a request's hint is the JSON list itself
     r"^data\.aoi: .*did you mean \[-92\.95,29\.76,-92\.9,29\.8\] \("),
    ([29.76, -92.95, 29.8, -92.9], "EPSG:4269", "", r"did you mean aoi=\["),  # any geographic CRS
    ([500000, 3291000, 512000, 3300000], None, "",  # UTM metres without aoi_crs
     r"^aoi: .* is outside lon/lat's range .*name the box's CRS with aoi_crs \(e\.g\. EPSG:32615"),
    ([-181, 0, 10, 10], None, "", r"outside lon/lat's range"),
    ([0, 0, 1, 1], "EPSG:nope", "", r"^aoi_crs: 'EPSG:nope' is not a coordinate reference system"),
])
def test_nonsense_boxes_are_refused_naming_the_field(aoi, crs, where, message):
    with pytest.raises(InputError, match=message) as caught:
        parse_aoi(aoi, crs, where=where)
    assert caught.value.param == where + ("aoi_crs" if crs == "EPSG:nope" else "aoi")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("aoi, crs", [
    (SCENE, None),
    ([-180, -90, 180, 90], None),
    ([500000, 3291000, 512000, 3300000], "EPSG:32615"),  # projected: not range-checked here
    ([1e12, 1e12, 1e13, 1e13], "EPSG:3857"),  # ... but caught when placed on the scene (below)
])
def test_sensible_boxes_parse(aoi, crs):
    assert list(parse_aoi(aoi, crs).bounds) == aoi


@pytest.mark.parametrize("aoi, crs, expected", [
    ([0, 0, 1, 1], "EPSG:32615", (0, 0, 1, 1)),  # same CRS: pixel edges
    ([-180, -90, 180, 90], None, (0, 0, 300, 400)),  # the world: the whole scene (UTM far away is not trusted)
    ([-100, 0, -80, 40], None, (0, 0, 300, 400)),  # a box around the scene
])
def test_windows(aoi, crs, expected):
    origin = [500000 + 30 * aoi[0], 3300000 - 30 * aoi[3], 500000 + 30 * aoi[2], 3300000 - 30 * aoi[1]]
    bounds = origin if crs == "EPSG:32615" else aoi
    assert aoi_window(parse_aoi(bounds, crs), UTM, GRID, 400, 300, "s.tif") == expected


@pytest.mark.parametrize("aoi, crs, message", [
    # lon 1..3 is where UTM 15N gives inf: still "does not overlap", with where the scene lies
    ([1, 2, 3, 4], None, r"^aoi: \[1,2,3,4\] \(EPSG:4326\) does not overlap s\.tif, which covers \[-93, 29\.7"),
    ([1e12, 1e12, 1e13, 1e13], "EPSG:3857", r"does not overlap s\.tif, which covers \[-1\.03\d*e\+07, "),
    ([10, 10, 11, 11], None, r"does not overlap s\.tif, which covers \[.*\] in EPSG:4326$"),
])
def test_boxes_that_miss_the_scene_say_where_it_is(aoi, crs, message):
    with pytest.raises(InputError, match=message) as caught:
        aoi_window(parse_aoi(aoi, crs), UTM, GRID, 400, 300, "s.tif")
    assert caught.value.param == "aoi"


def test_a_swapped_box_that_is_in_range_both_ways_is_told_its_lon_lat_form():
    """Near lon 10, lat 45 both orders are valid lon/lat: only the scene tells them apart."""
    grid = Affine(0.01, 0, 10, 0, -0.01, 46)  # a lon/lat scene, lon 10..11, lat 45..46
    with pytest.raises(InputError, match=r"does not overlap s\.tif, .*; did you mean aoi=\[10\.2,45\.2,10\.4,45\.4\]"
                                         r" \(\[lon_min") as caught:
        aoi_window(parse_aoi([45.2, 10.2, 45.4, 10.4]), CRS.from_epsg(4326), grid, 100, 100, "s.tif")
    hinted = [float(v) for v in re.search(r"aoi=\[([^\]]*)\]", str(caught.value)).group(1).split(",")]
    assert aoi_window(parse_aoi(hinted), CRS.from_epsg(4326), grid, 100, 100, "s.tif") == (60, 20, 20, 20)
