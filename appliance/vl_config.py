"""Resolve a model's `vision_language` config against its checkpoint's `config.json`.

Every field of `VisionLanguageConfig` except `image_input_type` and `limit_per_prompt` is a fact of the
checkpoint. Left unset in YAML, it is derived here; set, it must agree, else a `ConfigError` names the
field, the declared value and the checkpoint's (a wrong image token id or feature count gives wrong
answers, not errors, so we refuse to start instead).

Derivation, for a CLIP tower of `image_size` S, `patch_size` p, `hidden_size` H, with
`vision_feature_layer` L (an int, or a list of k layers whose features are concatenated):

    tokens per view  = (S // p) ** 2, + 1 (the CLS token) with vision_feature_select_strategy "full"
    image_input_shape
        pixel_values:   [3, S, S]                         one preprocessed view
        image_features: [tokens per view, H * k]          tower output after feature selection
    image_feature_size
        LLaVA-1.5:  tokens per view  (336/14, "default": 576)
        LLaVA-NeXT: None ("dynamic"): the base view plus the unpadded tile grid plus one newline per row,
                    which depends on each image's size (appliance.anyres_plan.llava_next_feature_count).
                    `max_image_feature_size` is the largest count any image can produce (an image exactly
                    the size of the largest pinpoint: 2928 for the llava-hf defaults).

For LLaVA-NeXT `image_input_shape` is per view: one image is a stack of 1 + rows * cols views.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Optional

from appliance.config.schema import ImageInputType
from appliance.engine.multimodal import image_token_id
from appliance.errors import ConfigError

# checkpoint architecture -> config.json model_type
SUPPORTED_ARCHITECTURES = {
    "LlavaForConditionalGeneration": "llava",
    "LlavaNextForConditionalGeneration": "llava_next",
}
_FIELD = "model.vision_language"


@dataclass(frozen=True)
class ResolvedVL:
    """The multimodal facts the engine and the request path need, all checked against the checkpoint."""

    architecture: str
    image_input_type: ImageInputType
    image_token_id: int
    image_input_shape: tuple[int, ...]  # one image (LLaVA-NeXT: one view); see the module docstring
    image_feature_size: Optional[int]  # placeholder tokens per image; None when it depends on the image
    max_image_feature_size: int  # the most placeholder tokens one image can take
    limit_per_prompt: int = 1

    @property
    def dynamic_feature_size(self) -> bool:
        return self.image_feature_size is None


def resolve_vision_language(model_cfg: Any) -> ResolvedVL:
    """`model_cfg` is the composed `model` group (a DictConfig or a `ModelConfig`); reads
    `<model_cfg.path>/config.json` offline."""
    declared_arch = _get(model_cfg, "architecture")
    if declared_arch not in SUPPORTED_ARCHITECTURES:
        raise ConfigError(f"model.architecture: {declared_arch!r} is not a supported vision-language "
                          f"architecture (supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    config = load_checkpoint_config(_get(model_cfg, "path"))
    checkpoint_arch = checkpoint_architecture(config.to_dict())
    if checkpoint_arch != declared_arch:
        raise ConfigError(f"model.architecture: declared {declared_arch}, checkpoint says {checkpoint_arch}")

    vl = _get(model_cfg, "vision_language")
    input_type = declared_input_type(model_cfg)
    derived = derive(config, input_type)
    for name, value in derived.items():
        check_field(name, _get(vl, name), value)
    limit = _get(vl, "limit_per_prompt", 1)
    if not isinstance(limit, int) or limit < 1:
        raise ConfigError(f"{_FIELD}.limit_per_prompt: must be a positive integer, got {limit!r}")
    return ResolvedVL(architecture=declared_arch, image_input_type=input_type, limit_per_prompt=limit,
                      max_image_feature_size=max_feature_size(config), **derived)


def declared_input_type(model_cfg: Any) -> ImageInputType:
    """What the model's requests carry per image (`model.vision_language.image_input_type`): declared,
    not read from the checkpoint."""
    return _input_type(_get(_get(model_cfg, "vision_language"), "image_input_type", ImageInputType.pixel_values))


def derive(config: Any, input_type: ImageInputType) -> dict:
    """The checkpoint's values of the checkable fields, from a transformers Llava(Next)Config."""
    vision = config.vision_config
    layers = config.vision_feature_layer
    num_layers = 1 if isinstance(layers, int) else len(layers)
    per_view = tokens_per_view(config)
    token = image_token_id(config)
    if token is None:
        raise ConfigError("config.json names no image token (image_token_id or image_token_index)")
    shape: tuple[int, ...]
    if input_type is ImageInputType.pixel_values:
        shape = (int(getattr(vision, "num_channels", 3)), int(vision.image_size), int(vision.image_size))
    else:
        shape = (per_view, int(vision.hidden_size) * num_layers)
    return {
        "image_token_id": int(token),
        "image_input_shape": shape,
        "image_feature_size": per_view if config.model_type == "llava" else None,
    }


def tokens_per_view(config: Any) -> int:
    vision = config.vision_config
    strategy = config.vision_feature_select_strategy
    if strategy not in ("default", "full"):
        raise ConfigError(f"config.json: vision_feature_select_strategy {strategy!r} (supported: default, full)")
    return (int(vision.image_size) // int(vision.patch_size)) ** 2 + (1 if strategy == "full" else 0)


def max_feature_size(config: Any) -> int:
    if config.model_type == "llava":
        return tokens_per_view(config)
    from appliance.anyres_plan import AnyresConfig, llava_next_feature_count

    anyres = AnyresConfig.from_model_config(config.to_dict())
    return max(llava_next_feature_count(pin, anyres) for pin in anyres.grid_pinpoints)


def check_field(name: str, declared: Any, checkpoint: Any) -> None:
    """Raise when a field set in YAML disagrees with the checkpoint; unset (None) always agrees."""
    if declared is None:
        return
    if name == "image_input_shape":
        declared = tuple(int(v) for v in declared)
    if declared == checkpoint:
        return
    if checkpoint is None:
        raise ConfigError(f"{_FIELD}.{name}: declared {declared}, checkpoint says dynamic (LLaVA-NeXT's count "
                          "depends on each image's size); remove it from the model config")
    shown = list(checkpoint) if isinstance(checkpoint, tuple) else checkpoint
    declared = list(declared) if isinstance(declared, tuple) else declared
    raise ConfigError(f"{_FIELD}.{name}: declared {declared}, checkpoint says {shown}; fix the value or remove "
                      "it from the model config to use the checkpoint's")


def load_checkpoint_config(path: Optional[str]):
    """transformers' config object for the checkpoint directory `path`, read offline."""
    if not path:
        raise ConfigError("model.path: required for a vision-language model (a directory in Hugging Face "
                          "layout with config.json); set model.path=DIR")
    config_file = os.path.join(str(path), "config.json")
    if not os.path.isfile(config_file):
        raise ConfigError(f"model.path: {path} has no config.json (expected a Hugging Face model directory)")
    try:
        with open(config_file) as f:
            raw = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"model.path: cannot read {config_file} ({e})") from None
    checkpoint_architecture(raw)  # unsupported -> ConfigError before transformers sees it
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as e:  # noqa: BLE001 - transformers raises many types for a bad config
        raise ConfigError(f"model.path: transformers cannot read {config_file}: {str(e).splitlines()[0]}") from None


def checkpoint_architecture(raw: dict) -> str:
    """The architecture config.json names (`architectures[0]`, else from `model_type`), if supported."""
    names = raw.get("architectures") or []
    model_type = raw.get("model_type")
    by_type = {t: a for a, t in SUPPORTED_ARCHITECTURES.items()}
    expected = by_type.get(model_type) if isinstance(model_type, str) else None
    arch = names[0] if names else expected
    if arch not in SUPPORTED_ARCHITECTURES or expected != arch:
        found = arch or f"model_type {model_type!r}"
        raise ConfigError(f"config.json: {found} is not a supported vision-language architecture "
                          f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    return arch


def _input_type(value: Any) -> ImageInputType:
    try:
        return ImageInputType(value)  # a member from the composed config, or a name from a plain mapping
    except ValueError:
        allowed = ", ".join(t.value for t in ImageInputType)
        raise ConfigError(f"{_FIELD}.image_input_type: {value!r} (allowed: {allowed})") from None


def _get(node: Any, key: str, default: Any = None) -> Any:
    if node is None:
        return default
    value = node.get(key, default) if isinstance(node, dict) else getattr(node, key, default)
    return default if value is None and default is not None else value
