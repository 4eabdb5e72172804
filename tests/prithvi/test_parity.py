"""Parity with terratorch: our model on the golden checkpoint reproduces terratorch's logits.

The fixture (tests/fixtures/prithvi_golden/, made by scripts/make_prithvi_golden.py with terratorch 1.2.11)
is a small Prithvi-EO-2.0 TL flood model and a 57x75 input that needs reflect padding to 64x96, a
non-square 4x6 token grid and a resized position table.
"""
import torch

from appliance.engine.models.prithvi import build_prithvi_segmentation, load_prithvi
from appliance.engine.models.prithvi.posembed import resize_pos_table, sincos_3d_table

from .helpers import GOLDEN, golden_meta, golden_prithvi_cfg, golden_reference, model_cfg

TOL = 1e-4


def _golden_model():
    return load_prithvi(model_cfg(golden_prithvi_cfg(), GOLDEN / "checkpoint.pt"))


def test_logits_match_terratorch_with_coords():
    ref = golden_reference()
    model = _golden_model()
    with torch.no_grad():
        out = model(ref["input"], ref["temporal_coords"], ref["location_coords"])
    assert out.shape == ref["logits"].shape
    assert (out - ref["logits"]).abs().max().item() < TOL


def test_logits_match_terratorch_without_coords():
    ref = golden_reference()
    with torch.no_grad():
        out = _golden_model()(ref["input"])
    assert (out - ref["logits_no_coords"]).abs().max().item() < TOL
    # The coordinates do matter, so the test above checks the encodings.
    assert (ref["logits"] - ref["logits_no_coords"]).abs().max().item() > 100 * TOL


def test_five_dim_input_gives_the_same_logits():
    ref = golden_reference()
    model = _golden_model()
    with torch.no_grad():
        out = model(ref["input"].unsqueeze(2), ref["temporal_coords"], ref["location_coords"])
    assert (out - ref["logits"]).abs().max().item() < TOL


def test_wide_grid_matches_terratorch_given_the_grid():
    """A 2x8 token grid: terratorch's neck, left to guess, reshapes its 16 tokens as 4x4; we know the grid.

    We match terratorch when its neck is told the grid height, and deliberately differ from its guess.
    """
    ref = golden_reference()
    with torch.no_grad():
        out = _golden_model()(ref["wide_input"])
    assert (out - ref["wide_logits_grid_given"]).abs().max().item() < TOL
    assert (out - ref["wide_logits_terratorch_default"]).abs().max().item() > 0.1


def test_resized_position_table_matches_terratorch():
    ref = golden_reference()["pos_embed_4x6"]
    meta = golden_meta()
    encoder = build_prithvi_segmentation(golden_prithvi_cfg(), meta["in_chans"]).encoder
    ours = resize_pos_table(encoder.pos_embed, encoder.base_grid, tuple(meta["token_grid"]))
    assert (ours - ref).abs().max().item() < 1e-6
    # A table computed directly for the 4x6 grid is a different table: the resize must be reproduced.
    direct = sincos_3d_table(meta["prithvi"]["embed_dim"], tuple(meta["token_grid"]))
    assert (direct - ref).abs().max().item() > 1.0


def test_safetensors_round_trip_keeps_the_logits(tmp_path):
    from appliance.engine.models.prithvi import save_safetensors

    ref = golden_reference()
    path = tmp_path / "golden.safetensors"
    save_safetensors(_golden_model(), str(path))
    model = load_prithvi(model_cfg(golden_prithvi_cfg(), path))
    with torch.no_grad():
        out = model(ref["input"], ref["temporal_coords"], ref["location_coords"])
    assert (out - ref["logits"]).abs().max().item() < TOL


def test_registry_entry_point_uses_the_engine_dtype():
    from omegaconf import OmegaConf

    from appliance.config.schema import EngineConfig
    from appliance.engine.models.prithvi import PrithviSegmentation

    engine = OmegaConf.merge(OmegaConf.structured(EngineConfig), {"kind": "pool", "dtype": "bfloat16"})
    model = PrithviSegmentation.from_config(model_cfg(golden_prithvi_cfg(), GOLDEN / "checkpoint.pt"), engine)
    assert next(model.parameters()).dtype == torch.bfloat16 and not model.training
    ref = golden_reference()
    with torch.no_grad():
        out = model(ref["input"].bfloat16(), ref["temporal_coords"], ref["location_coords"])
    assert (out.float() - ref["logits"]).abs().max().item() < 0.1  # bf16 is only roughly right
