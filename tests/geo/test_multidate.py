"""Multi-date input rules (stages/geo/multidate.py), pure parts: how `input` splits into scenes, how a
stacked file's bands map to dates, and `date=` for a multi-date model."""
import datetime as dt

import pytest

from appliance.errors import InputError
from appliance.stages.geo.multidate import input_scenes, multidate_spec, parse_dates, stacked_indexes

BANDS = ["BLUE", "GREEN", "RED", "NIR_NARROW", "SWIR_1", "SWIR_2"]


def no_items(href):
    raise AssertionError(f"no STAC item expected, got {href}")


@pytest.mark.parametrize("order, frames, bands, expected", [
    ("date_major", 3, 2, [1, 2, 3, 4, 5, 6]),          # date 1: bands 1,2; date 2: 3,4; date 3: 5,6
    ("band_major", 3, 2, [1, 4, 2, 5, 3, 6]),          # band 1 of dates 1..3 is 1,2,3
    ("date_major", 1, 3, [1, 2, 3]),
    ("band_major", 2, 3, [1, 3, 5, 2, 4, 6]),
])
def test_stacked_indexes(order, frames, bands, expected):
    assert stacked_indexes(order, frames, bands) == expected


@pytest.mark.parametrize("values, frames, expected", [
    (["d1.tif", "d2.tif", "d3.tif"], 3, [["d1.tif", "d2.tif", "d3.tif"]]),   # a flat list: one scene of 3 dates
    (["stack.tif"], 3, ["stack.tif"]),                                        # one stacked file
    ([["a1", "a2", "a3"], ["b1", "b2", "b3"]], 3, [["a1", "a2", "a3"], ["b1", "b2", "b3"]]),
    (["a.tif", "b.tif"], 1, ["a.tif", "b.tif"]),                              # one-date models: two scenes
    ([["b02", "b03"]], 1, [["b02", "b03"]]),
])
def test_input_scenes(values, frames, expected):
    assert input_scenes(values, frames) == expected


def test_a_list_of_dates_is_one_scene_with_every_dates_files():
    spec = multidate_spec(["d1.tif", ["b1.tif"] * 6, "d3.tif"], 3, None, BANDS, no_items)
    assert [d.files for d in spec.dates] == [("d1.tif",), ("b1.tif",) * 6, ("d3.tif",)]
    assert spec.files == ("d1.tif", *("b1.tif",) * 6, "d3.tif") and spec.name == "d1.tif"
    assert multidate_spec(["stack.tif"], 3, None, BANDS, no_items).dates == ()  # [[a.tif]]: a stacked file


@pytest.mark.parametrize("value, fragment", [
    (["d1.tif", "d2.tif"], "input: 2 dates given (d1.tif, d2.tif) but the model takes 3"),
    (["d1.tif"] * 4, "input: 4 dates given"),
])
def test_the_wrong_count_of_dates_is_refused(value, fragment):
    with pytest.raises(InputError, match=r"^" + fragment.replace("(", r"\(").replace(")", r"\)")) as e:
        multidate_spec(value, 3, None, BANDS, no_items)
    assert e.value.param == "input"


def test_dates_given_one_per_acquisition():
    dates = parse_dates(["2023-04-15", "2023-07-01", "2023-09-15"], 3)
    assert [d.date() for d in dates] == [dt.date(2023, 4, 15), dt.date(2023, 7, 1), dt.date(2023, 9, 15)]
    assert parse_dates(None, 3) is None
    with pytest.raises(InputError, match="date: the model takes 3 dates, one per acquisition"):
        parse_dates("2023-04-15", 3)
    with pytest.raises(InputError, match="date: 2 dates given but the model takes 3"):
        parse_dates(["2023-04-15", "2023-07-01"], 3)
    with pytest.raises(InputError, match="date: '2023-13-01' is not a date"):
        parse_dates(["2023-04-15", "2023-13-01", "2023-09-15"], 3)


def test_an_inner_list_of_one_file_is_that_file_for_a_one_date_model_too(scene, tmp_path):
    """`input=[[a.tif],[b.tif]]` (the Helm Job's shape for any model) is `input=[a.tif,b.tif]` for a one-date
    model, as it is two stacked files for a multi-date one."""
    import numpy as np
    import rasterio

    from tests.geo.conftest import run_geo

    path, _ = scene
    run_geo(str(path), tmp_path / "plain.tif")
    (record,) = run_geo([[str(path)]], tmp_path / "wrapped.tif")
    assert record["scene"].files == (str(path),) * 6
    with rasterio.open(tmp_path / "plain.tif") as a, rasterio.open(tmp_path / "wrapped.tif") as b:
        assert np.array_equal(a.read(), b.read())
