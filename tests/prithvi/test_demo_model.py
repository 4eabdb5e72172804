"""The embedded demo flood model (conf/model/prithvi_demo_flood.yaml) finds water in a scene it never saw.

Training (scripts/train_prithvi_flood.py) uses seeds 10000 and up; 4242 is held out.
"""
import numpy as np
import pytest
import torch

from appliance.config.compose import compose
from appliance.engine.models.prithvi import load_prithvi
from scripts.synthetic_scenes import NODATA_DN, NODATA_LABEL, WATER, make_scene

HELD_OUT_SEED = 4242


@pytest.fixture(scope="module")
def demo():
    cfg = compose(["model=prithvi_demo_flood"]).model
    return cfg, load_prithvi(cfg)


def model_input(dn: np.ndarray, geo) -> torch.Tensor:
    """As the flood pipeline prepares a tile: DN * scale, nodata -> reflectance 0, (x - mean) / std."""
    x = dn.astype(np.float32) * geo.scale
    x[:, (dn == NODATA_DN).any(axis=0)] = 0.0
    x = (x - np.asarray(geo.means, np.float32)[:, None, None]) / np.asarray(geo.stds, np.float32)[:, None, None]
    return torch.from_numpy(x.astype(np.float32))[None]


def test_demo_model_is_small_and_loads_from_the_embedded_config(demo):
    cfg, model = demo
    assert cfg.checkpoint.endswith("assets/models/prithvi_demo_flood/model.safetensors")
    assert list(cfg.geo.class_names) == ["land", "water"]
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    assert not model.training


def test_demo_model_finds_water_in_a_held_out_scene(demo):
    cfg, model = demo
    dn, labels = make_scene(128, 128, seed=HELD_OUT_SEED)
    with torch.no_grad():
        logits = model(model_input(dn, cfg.geo))
    assert logits.shape == (1, 2, 128, 128)
    pred = logits[0].argmax(0).numpy()
    keep = labels != NODATA_LABEL
    truth, found = labels[keep] == WATER, pred[keep] == WATER
    water_iou = (truth & found).sum() / (truth | found).sum()
    land_iou = (~truth & ~found).sum() / (~truth | ~found).sum()
    assert truth.sum() > 500, "the scene should hold some water"
    assert water_iou >= 0.8, f"water IoU {water_iou:.3f} on held-out seed {HELD_OUT_SEED}"
    assert land_iou >= 0.9, f"land IoU {land_iou:.3f} on held-out seed {HELD_OUT_SEED}"
