"""Where masks go: the output-naming rule, table-driven and pure."""
from pathlib import Path

import pytest

from appliance.errors import InputError
from appliance.stages.geo.raster_inputs import as_path_list, plan_outputs


@pytest.mark.parametrize(
    "inputs, output, expected",
    [
        (["a/s.tif"], None, ["a/s.mask.tif"]),  # beside the input
        (["a/s.TIFF"], None, ["a/s.mask.tif"]),
        (["a/s.v2.tif"], None, ["a/s.v2.mask.tif"]),  # only the .tif suffix is replaced
        (["s.tif"], None, ["s.mask.tif"]),
        (["a/s.tif"], "m.tif", ["m.tif"]),  # a .tif output is the file itself
        (["a/s.tif"], "out", ["out/s.mask.tif"]),  # anything else is a directory
        (["a/s.tif"], "out/", ["out/s.mask.tif"]),
        (["a/s.tif", "b/t.tif"], "out", ["out/s.mask.tif", "out/t.mask.tif"]),
        (["a/s.tif", "b/t.tif"], None, ["a/s.mask.tif", "b/t.mask.tif"]),
        (["a/s.tif", "b/t.tif"], "m.tif", "2 inputs need an output directory"),
        (["a/s.tif", "b/s.tif"], "out", "a/s.tif and b/s.tif would both write out/s.mask.tif"),
    ],
)
def test_plan_outputs(inputs, output, expected):
    if isinstance(expected, list):
        assert [dst for _, dst in plan_outputs(inputs, output)] == expected
    else:
        with pytest.raises(InputError, match=expected):
            plan_outputs(inputs, output)


def test_existing_directory_named_like_a_tif_is_a_directory(tmp_path):
    (tmp_path / "d.tif").mkdir()
    assert plan_outputs(["s.tif"], str(tmp_path / "d.tif")) == [("s.tif", str(tmp_path / "d.tif" / "s.mask.tif"))]


def test_custom_suffix():
    assert plan_outputs(["a/s.tif"], None, suffix="_water.tif") == [("a/s.tif", "a/s_water.tif")]


@pytest.mark.parametrize("value", [None, "", [], 5, ["a.tif", 3]])
def test_input_must_be_paths(value):
    with pytest.raises(InputError, match="input:"):
        as_path_list(value)


def test_input_list_forms():
    assert as_path_list("a.tif") == ["a.tif"]
    assert as_path_list(["a.tif", "b.tif"]) == ["a.tif", "b.tif"]


def test_no_output_beside_a_bundled_sample_is_refused_and_output_still_works(tmp_path):
    import appliance

    sample = str(Path(appliance.__file__).parent / "assets" / "samples" / "flood_sample.tif")
    with pytest.raises(InputError, match="inside the appliance package; pass output=PATH"):
        plan_outputs([sample], None)
    assert plan_outputs([sample], str(tmp_path)) == [(sample, str(tmp_path / "flood_sample.mask.tif"))]
