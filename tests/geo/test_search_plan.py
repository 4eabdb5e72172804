"""Planning a search's scenes (search_plan.py) and checking its keys (stac_search.py): pure, no API."""
import datetime as dt

import pytest

from appliance.errors import InputError
from appliance.stages.geo.search_plan import nearest_windows, plan_scenes, tile_of
from appliance.stages.geo.stac_search import check_bbox, check_datetime, check_search, cloud_params
from tests.geo.hls import STAC_BANDS


def day(n):
    return dt.datetime(2024, 1, 1) + dt.timedelta(days=n)


@pytest.mark.parametrize("days, frames, expected", [
    ([0, 10, 20], 3, [[0, 1, 2]]),
    ([0, 10], 3, []),  # too few dates
    ([0, 30, 32, 34, 60], 3, [[1, 2, 3]]),  # the tightest three, the rest left over
    ([0, 1, 2, 3, 4, 5], 3, [[0, 1, 2], [3, 4, 5]]),  # ties go to the earliest
    ([0, 50, 51, 52, 53, 90], 3, [[0, 4, 5], [1, 2, 3]]),  # then the next among the dates left
    ([0, 5, 9], 1, [[0], [1], [2]]),
])
def test_nearest_windows(days, frames, expected):
    assert nearest_windows([day(d) for d in days], frames) == expected


def item(id, tile="15RYP", days=0, bands=STAC_BANDS, crs="EPSG:32615", **properties):
    assets = {name: {"href": f"http://h/{id}/{name}.tif", "eo:bands": [{"common_name": name}]} for name in bands}
    return {"type": "Feature", "id": id, "assets": assets, "links": [{"rel": "self", "href": f"http://h/items/{id}"}],
            "properties": {"datetime": day(days).isoformat() + "Z", "grid:code": f"MGRS-{tile}", "proj:code": crs,
                           **properties}}


def test_one_date_model_maps_each_usable_item_and_says_why_others_are_skipped():
    odd_crs = item("c")
    odd_crs["assets"]["red"]["proj:code"] = "EPSG:32616"
    items = [item("a"), item("b", bands=STAC_BANDS[:-1]), odd_crs, item("d", days=3)]
    scenes, skipped = plan_scenes(items, STAC_BANDS, 1)
    assert [[i["id"] for i in scene] for scene in scenes] == [["a"], ["d"]]
    reasons = {s.item_id: s.reason for s in skipped}
    assert set(reasons) == {"b", "c"}
    assert "no asset for band(s) swir22" in reasons["b"]
    assert "different CRSs" in reasons["c"] and "red EPSG:32616" in reasons["c"]


def test_three_date_model_groups_dates_of_one_tile_in_time_order():
    items = [item(f"{tile}-{d}", tile=tile, days=d) for tile in ("15RYP", "15RYQ") for d in (40, 0, 10, 20, 90)]
    items.append(item("lonely", tile="16ABC", days=5))
    scenes, skipped = plan_scenes(items, STAC_BANDS, 3)
    assert [[i["id"] for i in scene] for scene in scenes] == [["15RYP-0", "15RYP-10", "15RYP-20"],
                                                               ["15RYQ-0", "15RYQ-10", "15RYQ-20"]]
    assert sorted(s.item_id for s in skipped) == ["15RYP-40", "15RYP-90", "15RYQ-40", "15RYQ-90", "lonely"]


@pytest.mark.parametrize("properties, id, tile", [
    ({"grid:code": "MGRS-15RYP"}, "x", "15RYP"),
    ({"mgrs:utm_zone": 5, "mgrs:latitude_band": "Q", "mgrs:grid_square": "KB"}, "x", "05QKB"),
    ({}, "HLS.S30.T15RXP.2024092T165849.v2.0", "15RXP"),
    ({}, "plain-id", "plain-id"),
])
def test_tile_of(properties, id, tile):
    assert tile_of({"id": id, "properties": properties}) == tile


@pytest.mark.parametrize("bbox, message", [
    ([1, 2, 3], "four numbers"),
    (["a", 0, 1, 1], "four numbers"),
    ([10, 0, 5, 1], "west < east"),
    ([0, -95, 1, 1], "south < north within -90..90"),
])
def test_bad_bbox_names_the_key(bbox, message):
    with pytest.raises(InputError, match=message) as e:
        check_bbox(bbox)
    assert e.value.param == "search.bbox"


@pytest.mark.parametrize("value, ok", [
    ("2024-04-01/2024-06-30", True), ("2024-04-01/..", True), ("../2024-06-30", True), ("2024-05-01", True),
    ("2024-06-30/2024-04-01", False), ("yesterday", False), ("2024-01-01/2024-02-01/2024-03-01", False),
    ("../..", False),
])
def test_datetime(value, ok):
    if ok:
        assert check_datetime(value) == value
    else:
        with pytest.raises(InputError) as e:
            check_datetime(value)
        assert e.value.param == "search.datetime"


@pytest.mark.parametrize("key, value", [("url", "ftp://x"), ("max_cloud_cover", 120), ("max_items", 0),
                                        ("page_size", 0)])
def test_bad_search_keys_name_the_key(key, value):
    search = {"url": "http://127.0.0.1:1", "max_items": 10, "page_size": 5, key: value}
    with pytest.raises(InputError) as e:
        check_search(search)
    assert e.value.param == f"search.{key}"


def test_cloud_filter_is_cql2_where_offered_else_query():
    assert cloud_params(30, True, True)["filter"] == {"op": "<=", "args": [{"property": "eo:cloud_cover"}, 30]}
    assert cloud_params(30, False, True) == {"query": {"eo:cloud_cover": {"lte": 30}}}
    with pytest.raises(InputError) as e:
        cloud_params(30, False, False)
    assert e.value.param == "search.max_cloud_cover"
