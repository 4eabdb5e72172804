"""The pipeline YAML in docs/geo.md (every option spelled out) builds and runs (engine swapped for the fake),
is the shipped file but for the options it spells out, and its values are the stages' defaults; the STAC
fields the page names are the ones an output item has."""
import json
import re

import rasterio
from omegaconf import OmegaConf

from tests.geo.conftest import REPO, make_cfg, run_geo
from tests.geo.test_chain import water_iou

SAMPLES = REPO / "appliance" / "assets" / "samples"


def documented_file():
    text = (REPO / "docs" / "geo.md").read_text()
    block = re.search(r"## `conf/pipeline/prithvi_flood.yaml`, every option spelled out.*?```yaml\n(.*?)```",
                      text, re.S).group(1)
    return block


def documented_stages():
    return OmegaConf.to_container(OmegaConf.create(documented_file()).pipeline.stages)


def test_documented_file_is_the_shipped_file_but_for_the_options():
    """The model and engine it selects, its name and inputs, and its stages' ids are the shipped file's."""
    documented = OmegaConf.to_container(OmegaConf.create(documented_file()))
    shipped = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "pipeline" / "prithvi_flood.yaml"))
    assert documented_file().splitlines()[0] == "# @package _global_"
    assert documented["defaults"] == shipped["defaults"]
    assert list(documented["pipeline"]["stages"]) == list(shipped["pipeline"]["stages"])
    del documented["pipeline"]["stages"], shipped["pipeline"]["stages"]
    assert documented == shipped


def test_the_stac_fields_named_are_the_items(tmp_path):
    text = (REPO / "docs" / "geo.md").read_text()
    section = re.search(r"### The STAC item beside the mask.*?\n### ", text, re.S).group(0)
    named = set(re.findall(r"`(proj:\w+)`", section))
    run_geo(str(SAMPLES / "flood_sample.tif"), tmp_path / "m.tif")
    written = {key for key in json.loads((tmp_path / "m.stac.json").read_text())["properties"]
               if key.startswith("proj:")}
    assert named - {"proj:wkt2"} == written  # wkt2: only for a CRS without an EPSG code


def proposed_stages():
    nodes = documented_stages()
    assert list(nodes).count("engine") == 1
    return {stage_id: {"stage": "fake_water_logits"} if stage_id == "engine" else node
            for stage_id, node in nodes.items()}


def test_proposed_pipeline_runs_on_the_sample(tmp_path):
    cfg = make_cfg(proposed_stages())
    records = run_geo(str(SAMPLES / "flood_sample.tif"), tmp_path / "m.tif", cfg=cfg)
    assert records[0]["display"].startswith(f"wrote {tmp_path / 'm.tif'}: 400x300, 1 tile, water ")
    mask = rasterio.open(tmp_path / "m.tif").read(1)
    labels = rasterio.open(SAMPLES / "flood_sample_labels.tif").read(1)
    assert water_iou(mask, labels) > 0.9


def test_documented_options_are_the_stage_defaults():
    """The block in docs/geo.md spells out each option's default: it must be what the stages' Options say."""
    from appliance.config.compose import compose

    documented = documented_stages()
    composed = OmegaConf.to_container(compose(["pipeline=prithvi_flood"]).pipeline.stages)
    assert list(documented) == list(composed)
    for stage_id, options in documented.items():
        assert set(options) == set(composed[stage_id]) - {"stage"}, stage_id
        for key, value in options.items():
            assert composed[stage_id][key] == value, f"{stage_id}.{key}"
