"""`appliance run` with a TL model (`model=prithvi_tiny_tl_flood`, random weights) on the bundled sample: the
date given and the sample's centre reach the model (its mask differs from the run without them, and its
tags say what it was given); a bad date is one line, exit 2; the embedded demo model (no encodings) is
given nothing, whatever the date."""
import numpy as np
import pytest
import rasterio

from appliance.stages.geo.raster_inputs import PACKAGE_DIR
from tests.conftest import assert_user_error, run_cli
from tests.geo.tiny_tl import tiny_tl_checkpoint

SAMPLE = PACKAGE_DIR / "assets" / "samples" / "flood_sample.tif"
ENV = {"OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def tiny_tl(tmp_path_factory):
    return tiny_tl_checkpoint(tmp_path_factory.mktemp("tiny_tl"))


def tl_run(checkpoint, output, *extra):
    return run_cli("run", "pipeline=prithvi_flood", "model=prithvi_tiny_tl_flood", f"model.checkpoint={checkpoint}",
                   f"input={SAMPLE}", f"output={output}", *extra, timeout=300, env=ENV)


def test_tl_model_runs_end_to_end_with_the_date_given(tiny_tl, tmp_path):
    dated, undated = tmp_path / "dated.tif", tmp_path / "undated.tif"
    result = tl_run(tiny_tl, dated, "date=2024-06-30")
    assert result.returncode == 0, result.stderr
    assert "no acquisition date" not in result.stderr
    result = tl_run(tiny_tl, undated)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("without its time encoding") == 1  # said once, not once per tile
    with rasterio.open(SAMPLE) as src:
        lon, lat = src.lnglat()
    with rasterio.open(dated) as a, rasterio.open(undated) as b:
        tags = a.tags()
        assert tags["model_time_coords"] == "2024,182" and tags["acquisition_date"] == "2024-06-30"
        assert tags["model_location_coords"] == f"{lat:.6f},{lon:.6f}"
        assert b.tags()["model_time_coords"] == "none (no acquisition date)"
        assert not np.array_equal(a.read(), b.read())  # the date reached the model


@pytest.mark.parametrize("date, fragment", [
    ("2024-13-01", "date: '2024-13-01' is not a date"),
    ("20240630", "date: 20240630 is not a date"),
    ("June", "date: 'June' is not a date"),
])
def test_a_bad_date_is_one_line_and_exit_2(tmp_path, date, fragment):
    result = run_cli("run", "pipeline=prithvi_flood", f"input={SAMPLE}", f"output={tmp_path / 'm.tif'}",
                     f"date={date}", timeout=120, env=ENV)
    assert_user_error(result, fragment, "YYYY-MM-DD")
    assert not list(tmp_path.iterdir())


def test_the_demo_model_is_given_nothing(tmp_path):
    plain, dated = tmp_path / "plain.tif", tmp_path / "dated.tif"
    for output, extra in ((plain, ()), (dated, ("date=2024-06-30",))):
        result = run_cli("run", "pipeline=prithvi_flood", f"input={SAMPLE}", f"output={output}", *extra,
                         timeout=120, env=ENV)
        assert result.returncode == 0, result.stderr
        assert "encoding" not in result.stderr
    with rasterio.open(plain) as a, rasterio.open(dated) as b:
        assert np.array_equal(a.read(), b.read())
        assert not any(key.startswith("model_") for key in {**a.tags(), **b.tags()})
