"""Shared helpers for the Prithvi tests: the golden fixture and small configs."""
import json
from pathlib import Path

from omegaconf import OmegaConf
from safetensors.torch import load_file

from appliance.config.schema import ModelConfig, PrithviConfig

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "prithvi_golden"
SEN1FLOODS11_BANDS = ["BLUE", "GREEN", "RED", "NIR_NARROW", "SWIR_1", "SWIR_2"]


def golden_meta() -> dict:
    return json.loads((GOLDEN / "meta.json").read_text())


def golden_reference() -> dict:
    return load_file(str(GOLDEN / "reference.safetensors"))


def golden_prithvi_cfg():
    return OmegaConf.merge(OmegaConf.structured(PrithviConfig), golden_meta()["prithvi"])


def model_cfg(prithvi, checkpoint, bands=SEN1FLOODS11_BANDS):
    """A ModelConfig (as compose would give it) for `prithvi` (a dict or config) and `checkpoint`."""
    return OmegaConf.merge(
        OmegaConf.structured(ModelConfig),
        {
            "name": "test-prithvi",
            "architecture": "PrithviSegmentation",
            "checkpoint": str(checkpoint),
            "prithvi": OmegaConf.to_container(prithvi) if OmegaConf.is_config(prithvi) else prithvi,
            "geo": {"bands": bands, "means": [0.0] * len(bands), "stds": [1.0] * len(bands),
                    "class_names": ["land", "water"]},
        },
    )


def small_cfg(**overrides):
    """A small TL config (fast to build) with the golden fixture's architecture."""
    base = {"embed_dim": 48, "depth": 2, "num_heads": 3, "coords_encoding": ["time", "location"],
            "coords_scale_learn": True, "selected_indices": [0, 1, 0, 1], "decoder_channels": 16}
    return OmegaConf.merge(OmegaConf.structured(PrithviConfig), {**base, **overrides})
