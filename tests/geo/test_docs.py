"""The pipeline YAML in docs/geo.md (every option spelled out) builds and runs (engine swapped for the fake),
and its values are the stages' defaults."""
import re

import rasterio
from omegaconf import OmegaConf

from tests.geo.conftest import REPO, make_cfg, run_geo
from tests.geo.test_chain import water_iou

SAMPLES = REPO / "appliance" / "assets" / "samples"


def documented_stages():
    text = (REPO / "docs" / "geo.md").read_text()
    block = re.search(r"## `conf/pipeline/prithvi_flood.yaml`, every option spelled out.*?```yaml\n(.*?)```", text, re.S).group(1)
    return OmegaConf.to_container(OmegaConf.create(block).pipeline.stages)


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
        assert set(options) == set(composed[stage_id]) - {"stage", "sampling"}, stage_id
        for key, value in options.items():
            assert composed[stage_id][key] == value, f"{stage_id}.{key}"
