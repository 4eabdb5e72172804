"""Masks are Cloud-Optimized GeoTIFFs by default (GDAL's COG layout, internal overviews, the colour table,
nodata and class names kept); `format: gtiff` writes the plain tiled GeoTIFF."""
from typing import List

import numpy as np
import pytest
import rasterio

from appliance.errors import ConfigError
from tests.geo.conftest import make_cfg, run_geo, stages

# The ghost header GDAL's COG driver writes at the top of the file (GDAL's COG specification).
COG_GHOST_MARKER = b"LAYOUT=IFDS_BEFORE_DATA"


def cog_problems(path: str) -> List[str]:
    """Why `path` is not a valid COG ([] when it is): GDAL's layout tag, the ghost header before the
    first IFD, tiling, and an internal overview per level down to one block."""
    problems = []
    with open(path, "rb") as f:
        if COG_GHOST_MARKER not in f.read(512):
            problems.append("no COG ghost header (IFDs are not before the data)")
    with rasterio.open(path) as ds:
        if ds.tags(ns="IMAGE_STRUCTURE").get("LAYOUT") != "COG":
            problems.append("GDAL does not report LAYOUT=COG")
        block_h, block_w = ds.block_shapes[0]
        if block_w >= ds.width and block_h >= ds.height:
            return problems  # one block: no tiling or overviews needed
        if not ds.profile.get("tiled"):
            problems.append("not tiled")
        factors = ds.overviews(1)
        if not factors:
            problems.append("no internal overviews")
        elif max(-(-ds.width // factors[-1]), -(-ds.height // factors[-1])) > max(block_w, block_h):
            problems.append(f"the smallest overview (1/{factors[-1]}) is larger than one block")
    return problems


def test_default_mask_is_a_valid_cog_with_the_gtiff_pixels(scene, tmp_path):
    path, _ = scene
    out = tmp_path / "out"
    run_geo(str(path), out / "cog.tif")
    run_geo(str(path), out / "plain.tif", write={"format": "gtiff"})
    assert cog_problems(str(out / "cog.tif")) == []
    with rasterio.open(out / "cog.tif") as cog, rasterio.open(out / "plain.tif") as plain:
        assert (cog.read() == plain.read()).all()
        assert (cog.crs, cog.transform, cog.nodata) == (plain.crs, plain.transform, 255)
        assert cog.colormap(1)[1] == plain.colormap(1)[1] == (0, 90, 255, 255)
        assert cog.tags()["class_names"] == "land,water" and cog.descriptions == ("class",)
        assert cog.compression.name == "deflate" and cog.block_shapes == [(256, 256)]
        assert cog.overviews(1) == [2]
        overview = cog.read(1, out_shape=(150, 200))  # served from the overview: classes only (mode)
        assert set(np.unique(overview)) <= {0, 1, 255} and (overview == 1).any()
    assert sorted(p.name for p in out.iterdir() if p.suffix != ".json") == ["cog.tif", "plain.tif"]  # no drafts


def test_gtiff_opt_out_is_not_a_cog(scene, tmp_path):
    path, _ = scene
    run_geo(str(path), tmp_path / "plain.tif", write={"format": "gtiff"})
    problems = cog_problems(str(tmp_path / "plain.tif"))
    assert "GDAL does not report LAYOUT=COG" in problems and "no internal overviews" in problems


def test_probabilities_cog_keeps_nan_nodata(scene, tmp_path):
    path, _ = scene
    run_geo(str(path), tmp_path / "p.tif", stitch={"output": "probabilities"})
    assert cog_problems(str(tmp_path / "p.tif")) == []
    with rasterio.open(tmp_path / "p.tif") as ds:
        assert ds.count == 2 and ds.dtypes[0] == "float32" and np.isnan(ds.nodata)
        assert ds.descriptions == ("p(land)", "p(water)")


def test_failed_run_leaves_no_draft_and_no_cog(scene, tmp_path):
    path, _ = scene
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="on purpose"):
        run_geo(str(path), out / "m.tif", fake={"fail_after": 5})
    assert list(out.iterdir()) == []


def test_unknown_overview_resampling_is_a_config_error(tmp_path):
    from appliance.stages.build import build_pipeline

    with pytest.raises(ConfigError, match="overview_resampling: 'median'"):
        build_pipeline(make_cfg(stages(write={"overview_resampling": "median"})))
