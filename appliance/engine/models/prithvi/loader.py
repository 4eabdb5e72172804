"""Prithvi checkpoints: read a terratorch `.pt`/`.ckpt`, an mmseg `.pth` or our `.safetensors`, map its
keys onto ours, assign it to a built model (`segmentation.load_prithvi` builds and loads), write ours.

terratorch layouts accepted (all normalised to ours, which is terratorch's current one without `model.`):
- a Lightning checkpoint `{"state_dict": {...}}` or a bare state dict;
- keys prefixed `model.` (the task's wrapped model); other top-level entries (`criterion.*`, ...) are dropped;
- the pyramid under `decoder.fpn{1,2}.*` (UperNetDecoder scale_modules, older configs) or `neck.2.fpn*`;
- `_timm_module.` in encoder keys (early terratorch); `aux_heads.*` (training-only heads) are dropped.
hls-foundation-os (mmcv) checkpoints `{"meta", "state_dict", "optimizer"}` load with their own key names
(`backbone.*`, `neck.*`, `decode_head.*`; `auxiliary_head.*`, training-only, is dropped); their `meta`'s
numpy scalars are read as plain values (engine/torch_files.py).
The encoder's `pos_embed` is a fixed table: the checkpoint's copy is replaced by ours (the reference does the same).
Every other key must match exactly, in name and shape, or loading fails listing the differences.
"""
import logging
import os
import re
from typing import Dict, Mapping

import torch

from appliance.engine.torch_files import load_torch_file
from appliance.errors import ConfigError

from .encoder import PrithviViT
from .posembed import sincos_3d_table

logger = logging.getLogger(__name__)

TORCH_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin")
_OLD_PYRAMID = re.compile(r"^decoder\.(fpn[1-4])\.")
TRAINING_ONLY_PREFIXES = ("aux_heads.", "auxiliary_head.")


def normalize_state_dict(state: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Map any accepted terratorch key layout onto ours; see the module docstring."""
    if any(k.startswith("model.") for k in state):
        dropped = sorted(k for k in state if not k.startswith("model."))
        if dropped:
            logger.debug("ignoring %d non-model checkpoint entries: %s", len(dropped), dropped[:5])
        state = {k[len("model."):]: v for k, v in state.items() if k.startswith("model.")}
    out = {}
    for key, value in state.items():
        if key.startswith(TRAINING_ONLY_PREFIXES):
            continue
        key = key.replace("_timm_module.", "")
        key = _OLD_PYRAMID.sub(r"neck.2.\1.", key)
        out[key] = value
    return out


def read_checkpoint(path: str) -> Dict[str, torch.Tensor]:
    """Raw tensors of a checkpoint file (`state_dict` wrapper removed), in the file's own key layout."""
    if not os.path.isfile(path):
        raise ConfigError(
            f"model.checkpoint {path!r} does not exist; pass model.checkpoint=PATH to a .pt or .safetensors file"
        )
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path, device="cpu")
    if not path.endswith(TORCH_SUFFIXES):
        raise ConfigError(f"model.checkpoint {path!r}: expected a .safetensors or {'/'.join(TORCH_SUFFIXES)} file")
    obj = load_torch_file(path)
    if isinstance(obj, Mapping) and isinstance(obj.get("state_dict"), Mapping):
        obj = obj["state_dict"]
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ConfigError(f"{path!r} does not hold a state dict (a mapping of names to tensors)")
    return dict(obj)


def check_keys(model: torch.nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """Raise ConfigError naming every missing, unexpected or mis-shaped key."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = sorted(
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in set(state) & set(expected)
        if tuple(state[k].shape) != tuple(expected[k].shape)
    )
    if not (missing or unexpected or shapes):
        return
    parts = []
    for title, keys in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", shapes)):
        if keys:
            parts.append(f"{title} ({len(keys)}): " + ", ".join(keys[:12]) + (", ..." if len(keys) > 12 else ""))
    raise ConfigError(
        f"checkpoint {source} does not match the model built from model.prithvi and model.geo: "
        + "; ".join(parts)
        + ". Check embed_dim/depth/num_heads/patch_size/coords_encoding/decoder_channels/num_classes, "
        "and that geo.bands lists as many bands as the checkpoint was trained on"
    )


def load_state(model: torch.nn.Module, state: Mapping[str, torch.Tensor], source: str = "state dict",
               dtype: torch.dtype = torch.float32) -> None:
    """Strictly load a (normalised) state dict into `model`, assigning tensors (works from the meta
    device); floating point tensors become `dtype` on the way (no copy where they already are)."""
    state = dict(state)
    encoder = model.encoder
    if not isinstance(encoder, PrithviViT):
        raise TypeError(f"load_state takes a Prithvi model (its `encoder` a PrithviViT), got {type(model).__name__}")
    state[f"{model.encoder_prefix}.pos_embed"] = sincos_3d_table(encoder.embed_dim, encoder.base_grid)
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    check_keys(model, state, source)
    model.load_state_dict(state, strict=True, assign=True)


def save_safetensors(model: torch.nn.Module, path: str) -> None:
    """Write the model's weights in our layout (terratorch's, without `model.`); config stays in the YAML."""
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path)
