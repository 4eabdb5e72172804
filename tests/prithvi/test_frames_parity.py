"""Parity with terratorch at three dates a sample: our model on the multi-date golden checkpoint
(tests/fixtures/prithvi_golden_t3/, made by `scripts/make_prithvi_golden.py --frames 3` with terratorch
1.2.11: num_frames 3, the neck's effective_time_dim 3) reproduces terratorch's logits with each date's own
time coordinates, without coordinates, and with the dates in reverse order."""
import json

import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from appliance.config.schema import PrithviConfig
from appliance.engine.models.prithvi import load_prithvi

from .helpers import GOLDEN, model_cfg
from .test_parity import TOL

GOLDEN_T3 = GOLDEN.parent / "prithvi_golden_t3"


def golden():
    meta = json.loads((GOLDEN_T3 / "meta.json").read_text())
    prithvi = OmegaConf.merge(OmegaConf.structured(PrithviConfig), meta["prithvi"])
    model = load_prithvi(model_cfg(prithvi, GOLDEN_T3 / "checkpoint.pt"))
    return model, load_file(str(GOLDEN_T3 / "reference.safetensors"))


def test_three_dates_match_terratorch_with_and_without_their_coordinates():
    model, ref = golden()
    assert model.encoder.num_frames == 3 and ref["input"].shape[2] == 3
    with torch.no_grad():
        dated = model(ref["input"], ref["temporal_coords"], ref["location_coords"])
        undated = model(ref["input"])
        reversed_dates = model(ref["input"][:, :, [2, 1, 0]])
    assert dated.shape == ref["logits"].shape
    assert (dated - ref["logits"]).abs().max().item() < TOL
    assert (undated - ref["logits_no_coords"]).abs().max().item() < TOL
    assert (reversed_dates - ref["logits_dates_reversed"]).abs().max().item() < TOL
    # Each of these inputs changes the answer, so matching all three checks the dates' encodings and order.
    assert (ref["logits"] - ref["logits_no_coords"]).abs().max().item() > 100 * TOL
    assert (ref["logits_no_coords"] - ref["logits_dates_reversed"]).abs().max().item() > 100 * TOL
