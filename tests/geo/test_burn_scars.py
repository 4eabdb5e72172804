"""`appliance run pipeline=prithvi_burn_scars` and `appliance serve pipeline=prithvi_burn_scars` with the
embedded demo model on the bundled sample: the mask carries the config's class names and colours (colour
table, STAC classes, quicklook legend), and the model finds the sample's burn scars.

The demo model (scripts/train_prithvi_flood.py --target burn_scar) trained on seeds 10000 and up; the
sample is seed 0, which training never saw.
"""
import json

import httpx
import numpy as np
import pytest
import rasterio
from PIL import Image

from tests.conftest import REPO, run_cli
from tests.server_process import server_process

SAMPLES = REPO / "appliance" / "assets" / "samples"
SAMPLE = SAMPLES / "burn_scars_sample.tif"
LABELS = SAMPLES / "burn_scars_sample_labels.tif"
UNBURNED, SCAR = (200, 200, 200), (230, 60, 40)  # conf/model/geo/hls_burn_scars.yaml
# The demo model gets burn scar IoU 0.925, unburned 0.984 on the sample (held-out seeds: metrics.json).
MIN_SCAR_IOU = 0.85


@pytest.fixture(scope="module")
def run_mask(tmp_path_factory):
    out = tmp_path_factory.mktemp("burn") / "scars.tif"
    result = run_cli("run", "pipeline=prithvi_burn_scars", f"input={SAMPLE}", f"output={out}",
                     "pipeline.stages.raster_write.quicklook=true", "pipeline.stages.stitch.progress=false")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"wrote {out}: 400x300, 1 tile, burn_scar "), result.stdout
    return out


def test_mask_carries_the_configs_names_and_colours(run_mask):
    with rasterio.open(run_mask) as ds:
        assert ds.dtypes == ("uint8",) and ds.nodata == 255
        assert ds.tags()["class_names"] == "unburned,burn_scar"
        table = ds.colormap(1)
        assert (table[0][:3], table[1][:3]) == (UNBURNED, SCAR)
    item = json.loads(run_mask.with_name("scars.stac.json").read_text())
    assert item["properties"]["appliance:pipeline"] == "prithvi_burn_scars"
    assert item["properties"]["appliance:model"] == "prithvi-demo-burn-scars"
    classes = item["assets"]["mask"]["classification:classes"]
    assert [(c["value"], c["name"], c.get("color_hint")) for c in classes] == [
        (0, "unburned", "C8C8C8"), (1, "burn_scar", "E63C28"), (255, "nodata", None)]
    with Image.open(run_mask.with_name("scars.quicklook.png")) as image:
        legend = np.asarray(image.convert("RGB"))[300:].reshape(-1, 3)  # the 400x300 picture, then the legend
    assert SCAR in {tuple(int(v) for v in c) for c in np.unique(legend, axis=0)}


def test_demo_model_finds_the_samples_burn_scars(run_mask):
    with rasterio.open(run_mask) as ds, rasterio.open(LABELS) as lab:
        mask, labels = ds.read(1), lab.read(1)
    with rasterio.open(SAMPLE) as src:
        nodata = (src.read() == src.nodata).any(axis=0)
    assert np.array_equal(mask == 255, nodata)
    keep = labels != 255
    truth, found = labels[keep] == 1, mask[keep] == 1
    assert truth.sum() > 5000, "the sample should hold burn scars"
    scar_iou = (truth & found).sum() / (truth | found).sum()
    unburned_iou = (~truth & ~found).sum() / (~truth | ~found).sum()
    assert scar_iou >= MIN_SCAR_IOU, f"burn scar IoU {scar_iou:.3f}"
    assert unburned_iou >= 0.95, f"unburned IoU {unburned_iou:.3f}"


@pytest.mark.slow
def test_served_burn_scars_answer_as_appliance_run(run_mask, tmp_path):
    with server_process("pipeline=prithvi_burn_scars", cwd=tmp_path) as server:
        pool = httpx.post(f"{server.base}/v1/pool", content=SAMPLE.read_bytes(),
                          headers={"Content-Type": "image/tiff"}, timeout=120)
        assert pool.status_code == 200 and pool.headers["content-type"] == "image/tiff", pool.text
        (tmp_path / "served.tif").write_bytes(pool.content)
        models = httpx.get(f"{server.base}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["prithvi-demo-burn-scars"]
    with rasterio.open(tmp_path / "served.tif") as got, rasterio.open(run_mask) as expected:
        assert np.array_equal(got.read(), expected.read())
        assert (got.crs, got.transform) == (expected.crs, expected.transform)
        assert got.colormap(1)[1][:3] == SCAR and got.tags()["class_names"] == "unburned,burn_scar"


def test_a_stac_item_gives_the_files_mask(tmp_path):
    """The burn scars sample as a STAC item of per-band COGs: the same mask as the file."""
    from tests.geo.hls import split_bands, stac_item

    bands = split_bands(SAMPLE, tmp_path / "hls")
    item = stac_item(tmp_path / "hls" / "item.json", [p.name for p in bands])
    outputs = {}
    for name, source in (("file", SAMPLE), ("stac", item)):
        outputs[name] = tmp_path / f"{name}.tif"
        result = run_cli("run", "pipeline=prithvi_burn_scars", f"input={source}", f"output={outputs[name]}",
                         "pipeline.stages.stitch.progress=false", env={"OMP_NUM_THREADS": "1"})
        assert result.returncode == 0, result.stderr
    with rasterio.open(outputs["stac"]) as a, rasterio.open(outputs["file"]) as b:
        assert np.array_equal(a.read(1), b.read(1)) and a.transform == b.transform and a.crs == b.crs
        assert a.colormap(1)[1] == b.colormap(1)[1]
    assert json.loads(outputs["stac"].with_name("stac.stac.json").read_text())["properties"]["datetime"] \
        == "2024-04-09T16:58:49Z"
