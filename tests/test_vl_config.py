"""vision_language resolution: values derived from config.json, and a ConfigError for each disagreement.

Checkpoint directories are config.json files only, in the llava-hf layouts: built from transformers'
LlavaConfig / LlavaNextConfig defaults (CLIP ViT-L/14-336, image_token_index 32000), plus the
sparse file llava-hf/llava-1.5-7b-hf actually publishes (sub-configs list only non-default keys).
"""
import json

import pytest
from omegaconf import OmegaConf

from appliance.config.schema import ModelConfig, VisionLanguageConfig
from appliance.errors import ConfigError
from appliance.vl_config import SUPPORTED_ARCHITECTURES, ResolvedVL, resolve_vision_language

LLAVA = "LlavaForConditionalGeneration"
NEXT = "LlavaNextForConditionalGeneration"

# llava-hf/llava-1.5-7b-hf config.json as published (transformers 4.36 wrote only non-defaults)
PUBLISHED_LLAVA_15 = {
    "architectures": [LLAVA], "ignore_index": -100, "image_token_index": 32000, "model_type": "llava",
    "pad_token_id": 32001, "projector_hidden_act": "gelu",
    "text_config": {"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 4096,
                    "model_type": "llama", "rms_norm_eps": 1e-05, "torch_dtype": "float16", "vocab_size": 32064},
    "tie_word_embeddings": False, "torch_dtype": "float16",
    "vision_config": {"hidden_size": 1024, "image_size": 336, "intermediate_size": 4096,
                      "model_type": "clip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 24,
                      "patch_size": 14, "projection_dim": 768, "vocab_size": 32000},
    "vision_feature_layer": -2, "vision_feature_select_strategy": "default", "vocab_size": 32064,
}


def checkpoint(tmp_path, architecture=LLAVA, name="ckpt", **overrides):
    """A directory with config.json saved by transformers from its defaults (plus `overrides`)."""
    from transformers import LlavaConfig, LlavaNextConfig

    config = (LlavaConfig if architecture == LLAVA else LlavaNextConfig)(**overrides)
    config.architectures = [architecture]
    config.save_pretrained(tmp_path / name)
    return tmp_path / name


def model_cfg(path, architecture=LLAVA, **vision_language):
    """The composed `model` node as the stages receive it (a structured DictConfig)."""
    cfg = ModelConfig(name="m", architecture=architecture, path=str(path),
                      vision_language=VisionLanguageConfig(**vision_language))
    return OmegaConf.structured(cfg)


# ---- derivation ----

@pytest.mark.parametrize("architecture, input_type, shape, feature_size, max_size", [
    (LLAVA, "pixel_values", (3, 336, 336), 576, 576),
    (LLAVA, "image_features", (576, 1024), 576, 576),
    (NEXT, "pixel_values", (3, 336, 336), None, 576 + 48 * 48 + 48),   # 672x672: 2x2 tiles, no unpadding
    (NEXT, "image_features", (576, 1024), None, 2928),
])
def test_derived_from_llava_hf_defaults(tmp_path, architecture, input_type, shape, feature_size, max_size):
    resolved = resolve_vision_language(model_cfg(checkpoint(tmp_path, architecture), architecture,
                                                 image_input_type=input_type))
    assert resolved == ResolvedVL(architecture=architecture, image_input_type=input_type, image_token_id=32000,
                                  image_input_shape=shape, image_feature_size=feature_size,
                                  max_image_feature_size=max_size, limit_per_prompt=1)
    assert resolved.dynamic_feature_size is (feature_size is None)


def test_published_sparse_llava_15_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(PUBLISHED_LLAVA_15))
    resolved = resolve_vision_language(model_cfg(tmp_path, image_input_type="image_features"))
    assert (resolved.image_token_id, resolved.image_input_shape, resolved.image_feature_size) == \
        (32000, (576, 1024), 576)


def test_image_token_id_key_and_missing_vision_language(tmp_path):
    """Newer files write `image_token_id`; a model config without vision_language takes all defaults."""
    raw = {**PUBLISHED_LLAVA_15, "image_token_id": 32005}
    del raw["image_token_index"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    cfg = OmegaConf.structured(ModelConfig(name="m", architecture=LLAVA, path=str(tmp_path)))
    resolved = resolve_vision_language(cfg)
    assert (resolved.image_token_id, resolved.image_input_type.value) == (32005, "pixel_values")


@pytest.mark.parametrize("overrides, input_type, shape, feature_size", [
    ({"vision_feature_select_strategy": "full"}, "pixel_values", (3, 336, 336), 577),
    ({"vision_feature_select_strategy": "full"}, "image_features", (577, 1024), 577),
    ({"vision_feature_layer": [-2, -5]}, "image_features", (576, 2048), 576),   # layers concatenated
    ({"vision_config": {"model_type": "clip_vision_model", "image_size": 224, "patch_size": 14,
                        "hidden_size": 768}}, "image_features", (256, 768), 256),
    ({"vision_config": {"model_type": "clip_vision_model", "image_size": 112, "patch_size": 14,
                        "hidden_size": 64, "num_attention_heads": 2},
      "image_token_index": 427}, "pixel_values", (3, 112, 112), 64),
])
def test_derivation_table(tmp_path, overrides, input_type, shape, feature_size):
    resolved = resolve_vision_language(model_cfg(checkpoint(tmp_path, **overrides), image_input_type=input_type))
    assert (resolved.image_input_shape, resolved.image_feature_size) == (shape, feature_size)


def test_agreeing_declarations_pass(tmp_path):
    path = checkpoint(tmp_path)
    resolved = resolve_vision_language(model_cfg(path, image_token_id=32000, image_input_shape=[3, 336, 336],
                                                 image_feature_size=576, limit_per_prompt=2))
    assert resolved.limit_per_prompt == 2
    resolved = resolve_vision_language(model_cfg(path, image_input_type="image_features",
                                                 image_input_shape=[576, 1024]))
    assert resolved.image_input_shape == (576, 1024)


# ---- one error per disagreeing field ----

@pytest.mark.parametrize("architecture, declared, message", [
    (LLAVA, {"image_token_id": 32001},
     "model.vision_language.image_token_id: declared 32001, checkpoint says 32000"),
    (LLAVA, {"image_input_shape": [3, 224, 224]},
     "model.vision_language.image_input_shape: declared [3, 224, 224], checkpoint says [3, 336, 336]"),
    (LLAVA, {"image_input_type": "image_features", "image_input_shape": [577, 1024]},
     "model.vision_language.image_input_shape: declared [577, 1024], checkpoint says [576, 1024]"),
    (LLAVA, {"image_feature_size": 577},
     "model.vision_language.image_feature_size: declared 577, checkpoint says 576"),
    (NEXT, {"image_feature_size": 576},
     "model.vision_language.image_feature_size: declared 576, checkpoint says dynamic"),
    (NEXT, {"image_token_id": 32001},
     "model.vision_language.image_token_id: declared 32001, checkpoint says 32000"),
])
def test_mismatch_names_field_declared_and_checkpoint_value(tmp_path, architecture, declared, message):
    with pytest.raises(ConfigError) as err:
        resolve_vision_language(model_cfg(checkpoint(tmp_path, architecture), architecture, **declared))
    assert message in str(err.value)


def test_declared_architecture_must_match_checkpoint(tmp_path):
    with pytest.raises(ConfigError, match=f"model.architecture: declared {NEXT}, checkpoint says {LLAVA}"):
        resolve_vision_language(model_cfg(checkpoint(tmp_path, LLAVA), NEXT))


@pytest.mark.parametrize("declared, config_json", [
    ("LlamaForCausalLM", None),  # not a VLM in the model config
    (LLAVA, {"architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl"}),
    (LLAVA, {"model_type": "mllama"}),  # no architectures key: named from model_type
])
def test_unsupported_architecture_lists_supported(tmp_path, declared, config_json):
    if config_json is None:
        path = checkpoint(tmp_path)
    else:
        (tmp_path / "config.json").write_text(json.dumps(config_json))
        path = tmp_path
    with pytest.raises(ConfigError) as err:
        resolve_vision_language(model_cfg(path, declared))
    assert "not a supported vision-language architecture" in str(err.value)
    assert all(arch in str(err.value) for arch in SUPPORTED_ARCHITECTURES)


@pytest.mark.parametrize("path, fragment", [
    (None, "model.path: required"),
    ("missing_dir", "has no config.json"),
])
def test_missing_checkpoint(tmp_path, path, fragment):
    cfg = model_cfg(tmp_path / path if path else None)
    if path is None:
        cfg.path = None
    with pytest.raises(ConfigError, match=fragment):
        resolve_vision_language(cfg)


def test_invalid_limit_and_plain_dataclass_input(tmp_path):
    path = checkpoint(tmp_path)
    cfg = ModelConfig(name="m", architecture=LLAVA, path=str(path),
                      vision_language=VisionLanguageConfig(limit_per_prompt=0))
    with pytest.raises(ConfigError, match="limit_per_prompt: must be a positive integer"):
        resolve_vision_language(cfg)
    cfg.vision_language.limit_per_prompt = 3
    assert resolve_vision_language(cfg).limit_per_prompt == 3
