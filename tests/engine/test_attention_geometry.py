"""A model's attention geometry and its KV bytes (attention_geometry.py): the one rule the models, the
memory plan, the runner's KV pool and the config check all read."""
import json

import pytest
import torch
from transformers import LlamaConfig, LlavaConfig

from appliance.config.engine_check import model_head_dim
from appliance.engine.attention_geometry import AttentionGeometry, head_dim_of, kv_heads_of


@pytest.mark.parametrize("config, head_dim, kv_heads", [
    (LlamaConfig(hidden_size=512, num_attention_heads=8), 64, 8),  # no GQA: a KV head a query head
    (LlamaConfig(hidden_size=512, num_attention_heads=8, num_key_value_heads=2), 64, 2),
    (LlamaConfig(hidden_size=512, num_attention_heads=8, head_dim=128), 128, 8),  # set: it wins
])
def test_head_dim_and_kv_heads_of_a_config(config, head_dim, kv_heads):
    assert (head_dim_of(config), kv_heads_of(config)) == (head_dim, kv_heads)


@pytest.mark.parametrize("world, heads, kv_heads", [(1, 8, 2), (2, 4, 1), (4, 2, 1)])
def test_geometry_of_a_rank(world, heads, kv_heads):
    """Heads split over the ranks; a rank keeps at least one KV head (replicated when there are fewer)."""
    config = LlamaConfig(hidden_size=512, num_attention_heads=8, num_key_value_heads=2, num_hidden_layers=3)
    assert AttentionGeometry.of(config, world, 16) == AttentionGeometry(heads, kv_heads, 64, 16, num_layers=3)


def test_geometry_of_a_multimodal_model_is_its_language_models():
    config = LlavaConfig(text_config=LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                                                 num_hidden_layers=2).to_dict())
    assert AttentionGeometry.of(config, 1, 64) == AttentionGeometry(4, 2, 64, 64, num_layers=2)


def test_kv_bytes_are_k_and_v_of_every_layer_in_whole_blocks():
    g = AttentionGeometry(num_heads=32, num_kv_heads=8, head_dim=128, block_size=16, num_layers=32)
    block = 2 * 32 * 16 * 8 * 128
    assert g.block_bytes(torch.float32) == 4 * block and g.block_bytes(torch.bfloat16) == 2 * block
    assert g.bytes_for(16, torch.bfloat16) == g.bytes_for(1, torch.bfloat16) == 2 * block
    assert g.bytes_for(17, torch.bfloat16) == 4 * block


@pytest.mark.parametrize("config, expected", [
    ({"hidden_size": 640, "num_attention_heads": 8}, 80),
    ({"hidden_size": 640, "num_attention_heads": 8, "head_dim": 128}, 128),
    ({"text_config": {"hidden_size": 512, "num_attention_heads": 4}, "hidden_size": 1}, 128),
    ({"hidden_size": 640}, None),  # cannot tell: the check leaves it to the engine
])
def test_the_config_check_reads_the_same_head_dim(tmp_path, config, expected):
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert model_head_dim(type("Model", (), {"path": str(tmp_path)})) == expected
