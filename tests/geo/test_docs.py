"""The pipeline YAML proposed in docs/geo.md builds and runs (engine swapped for the fake)."""
import re

import rasterio
from omegaconf import OmegaConf

from tests.geo.conftest import REPO, make_cfg, run_geo
from tests.geo.test_chain import water_iou

SAMPLES = REPO / "appliance" / "assets" / "samples"


def proposed_stages():
    text = (REPO / "docs" / "geo.md").read_text()
    block = re.search(r"## Proposed `conf/pipeline/prithvi_flood.yaml`\s+```yaml\n(.*?)```", text, re.S).group(1)
    nodes = OmegaConf.to_container(OmegaConf.create(block).pipeline.stages)
    assert [n["stage"] for n in nodes].count("engine") == 1
    return [{"stage": "fake_water_logits"} if n["stage"] == "engine" else n for n in nodes]


def test_proposed_pipeline_runs_on_the_sample(tmp_path):
    cfg = make_cfg(proposed_stages())
    records = run_geo(str(SAMPLES / "flood_sample.tif"), tmp_path / "m.tif", cfg=cfg)
    assert records[0]["display"].startswith(f"wrote {tmp_path / 'm.tif'}: 400x300, 1 tile, water ")
    mask = rasterio.open(tmp_path / "m.tif").read(1)
    labels = rasterio.open(SAMPLES / "flood_sample_labels.tif").read(1)
    assert water_iou(mask, labels) > 0.9
