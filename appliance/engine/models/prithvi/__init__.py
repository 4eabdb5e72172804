"""Prithvi-EO-2.0 segmentation in plain PyTorch (no terratorch/timm), loading terratorch checkpoints.

Public API:
- `build_prithvi_segmentation(prithvi_cfg, in_chans)`: the model with random weights.
- `load_prithvi(model_cfg)`: build from a `ModelConfig` and load `model_cfg.checkpoint` strictly.
See docs/prithvi.md.
"""
from .loader import load_state, normalize_state_dict, read_checkpoint, save_safetensors
from .segmentation import PrithviSegmentation, build_prithvi_segmentation, load_prithvi

__all__ = [
    "PrithviSegmentation",
    "build_prithvi_segmentation",
    "load_prithvi",
    "load_state",
    "normalize_state_dict",
    "read_checkpoint",
    "save_safetensors",
]
