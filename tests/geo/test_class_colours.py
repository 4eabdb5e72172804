"""Class colours declared in `model.geo.class_colours` reach every output: the mask's colour table and
`class_colours` tag, the quicklook's overlay and legend, the STAC item's classes and the scene report
(summary and mask.png's palette); a bad declaration fails naming the key. Fake logits stand in for the model."""
import json

import numpy as np
import pytest
import rasterio
from omegaconf import OmegaConf
from PIL import Image

from appliance.config.compose import compose
from appliance.errors import ConfigError
from appliance.stages.geo.class_colours import (NODATA_GREY, checked_colours, colours_tag, default_colours,
                                                parse_colours_tag)
from appliance.stages.geo.scene_report import write_scene_report
from tests.geo.conftest import make_cfg, run_geo

# Colours no default uses, so that finding them proves they came from the config.
DECLARED = [(11, 22, 33), (250, 5, 120)]


def cfg_with_colours(colours, **kwargs):
    cfg = make_cfg(**kwargs)
    cfg.model.geo.class_colours = [list(c) for c in colours]
    return cfg


def test_declared_colours_reach_the_mask_quicklook_stac_and_report(scene, tmp_path):
    path, _ = scene
    mask = tmp_path / "m.tif"
    cfg = cfg_with_colours(DECLARED, write={"quicklook": True, "quicklook_size": 200})
    (record,) = run_geo(str(path), mask, cfg=cfg)

    with rasterio.open(mask) as ds:
        table = ds.colormap(1)
        assert [table[0][:3], table[1][:3]] == DECLARED
        assert ds.tags()["class_colours"] == "#0B1621,#FA0578"
        classes = ds.read(1)
    assert {0, 1} <= set(np.unique(classes))  # both classes are drawn, so both colours matter

    item = json.loads((tmp_path / "m.stac.json").read_text())
    found = item["assets"]["mask"]["classification:classes"]
    assert [(c["value"], c["name"], c.get("color_hint")) for c in found] == [
        (0, "land", "0B1621"), (1, "water", "FA0578"), (255, "nodata", None)]

    with Image.open(tmp_path / "m.quicklook.png") as image:
        legend = np.asarray(image.convert("RGB"))[150:].reshape(-1, 3)
        picture = np.asarray(image.convert("RGB"))[:150]
    assert DECLARED[1] in {tuple(int(v) for v in c) for c in np.unique(legend, axis=0)}  # water's swatch
    blue = np.asarray(default_colours(2)[1])
    assert not (legend == blue).all(axis=1).any()  # the default water colour appears nowhere in the legend
    assert picture.shape == (150, 200, 3)

    report = tmp_path / "report"
    report.mkdir()
    summary = write_scene_report(record["scene"], str(mask), str(report), preview_size=200)
    assert [tuple(c["colour"]) for c in summary["classes"]] == DECLARED
    with Image.open(report / "mask.png") as image:
        assert image.getpalette()[:9] == [*DECLARED[0], *DECLARED[1], *NODATA_GREY]


@pytest.mark.parametrize("output", ["classes", "probabilities"])
def test_report_reads_the_colours_of_a_probability_mask_from_its_tag(scene, tmp_path, output):
    """A float mask has no colour table: the `class_colours` tag carries the colours to the report."""
    path, _ = scene
    (record,) = run_geo(str(path), tmp_path / "m.tif", cfg=cfg_with_colours(DECLARED, stitch={"output": output}))
    summary = write_scene_report(record["scene"], str(tmp_path / "m.tif"), str(tmp_path), preview_size=100)
    assert [tuple(c["colour"]) for c in summary["classes"]] == DECLARED


def test_no_declared_colours_gives_the_defaults(scene, tmp_path):
    path, _ = scene
    run_geo(str(path), tmp_path / "m.tif")  # conftest's GEO declares no class_colours
    with rasterio.open(tmp_path / "m.tif") as ds:
        assert [ds.colormap(1)[i][:3] for i in (0, 1)] == default_colours(2) == [(200, 200, 200), (0, 90, 255)]


@pytest.mark.parametrize("overrides, fragments", [
    (["model.geo.class_colours=[[1,2,3]]"],
     ["model.geo.class_colours", "1 colour for 2 classes", "unburned, burn_scar"]),
    (["model.geo.class_colours=[[1,2,3],[0,0,256]]"],
     ["model.geo.class_colours", "burn_scar", "[0, 0, 256]", "0..255"]),
    (["model.geo.class_colours=[[1,2,3],[-1,0,0]]"], ["model.geo.class_colours", "burn_scar", "[-1, 0, 0]"]),
    (["model.geo.class_colours=[[1,2,3],[0,0]]"], ["model.geo.class_colours", "burn_scar", "[0, 0]"]),
    (["model.geo.class_colours=[[1,2,3],[0,0,x]]"], ["model.geo.class_colours"]),
    (["pipeline.stages.raster_write.class_names=[a,b,c]"],
     ["pipeline.stages.raster_write.class_names", "3 class names", "model.geo.class_colours has 2 colours"]),
])
def test_bad_colours_fail_naming_the_key(overrides, fragments):
    with pytest.raises(ConfigError) as caught:
        compose(["pipeline=prithvi_burn_scars", *overrides])
    message = str(caught.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message


def test_renamed_classes_keep_the_colours_and_null_colours_take_the_defaults():
    cfg = compose(["pipeline=prithvi_burn_scars", "model.geo.class_colours=null",
                   "pipeline.stages.raster_write.class_names=[a,b,c]"])
    assert cfg.model.geo.class_colours is None
    cfg = compose(["pipeline=prithvi_burn_scars", "pipeline.stages.raster_write.class_names=[green,scar]"])
    assert OmegaConf.to_container(cfg.model.geo.class_colours) == [[200, 200, 200], [230, 60, 40]]


@pytest.mark.parametrize("model, names, colours", [
    ("prithvi_demo_flood", ["land", "water"], [[200, 200, 200], [0, 90, 255]]),  # as before colours were declared
    ("prithvi_300m_tl_flood", ["land", "water"], [[200, 200, 200], [0, 90, 255]]),
    ("prithvi_demo_burn_scars", ["unburned", "burn_scar"], [[200, 200, 200], [230, 60, 40]]),
    ("prithvi_300m_burn_scars", ["unburned", "burn_scar"], [[200, 200, 200], [230, 60, 40]]),
])
def test_shipped_models_declare_a_colour_per_class(model, names, colours):
    geo = compose([f"model={model}"]).model.geo
    assert list(geo.class_names) == names
    assert OmegaConf.to_container(geo.class_colours) == colours
    assert checked_colours(geo.class_colours, geo.class_names) == [tuple(c) for c in colours]


def test_colours_tag_round_trip_and_fallbacks():
    assert parse_colours_tag(colours_tag(DECLARED), 2) == DECLARED
    assert parse_colours_tag(None, 3) == default_colours(3)
    assert parse_colours_tag("#0B1621", 2) == default_colours(2)  # one colour for two classes: not this mask's
    assert parse_colours_tag("#0B1621,#zzzzzz", 2) == default_colours(2)
    assert default_colours(7)[5:] == default_colours(2)  # the defaults cycle
