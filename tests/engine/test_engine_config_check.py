"""Engine settings that can never run are refused while the config is composed, so `appliance check`
names the constraint in one line before any weight loads; `auto` is never refused (it falls back)."""
import json

import pytest
import torch

from appliance.config.compose import compose
from appliance.errors import ConfigError
from tests.conftest import assert_user_error, run_cli

XF = ["pipeline=llava_chat", "engine=cuda", "engine.attention_backend=xformers"]


@pytest.fixture
def head_dim_80(tmp_path):
    """A model directory whose config.json gives the language model a head dim xformers refuses."""
    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLM"], "hidden_size": 640, "num_attention_heads": 8}))
    return str(tmp_path)


@pytest.mark.parametrize("overrides, fragments", [
    (["engine.block_size=16"], ["engine.attention_backend=xformers cannot run", "engine.block_size=16",
                                "triton_splitk.FwOp", "multiple of 64"]),
    (["engine.dtype=float32"], ["engine.dtype=float32", "runs only bfloat16 or float16"]),
    (["engine.device=cpu"], ["needs engine.device=cuda (got cpu)"]),
])
def test_xformers_config_that_cannot_run_is_refused(overrides, fragments):
    with pytest.raises(ConfigError) as err:
        compose(XF + overrides)
    for fragment in fragments:
        assert fragment in str(err.value), str(err.value)


def test_head_dim_comes_from_the_model(head_dim_80):
    with pytest.raises(ConfigError, match="head dim 80: xformers' triton_splitk.FwOp"):
        compose(XF + [f"model.path={head_dim_80}"])


def checkpoint(path, dtype: str) -> str:
    """A model directory whose config.json declares `dtype` (head dim 64, as xformers takes it)."""
    from safetensors.torch import save_file

    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 512,
                                                  "num_attention_heads": 8, "torch_dtype": dtype}))
    save_file({"w": torch.zeros(2, dtype=getattr(torch, dtype))}, str(path / "model.safetensors"))
    return str(path)


@pytest.mark.parametrize("own, refused", [("float32", True), ("float64", True), ("float16", False),
                                          ("bfloat16", False)])
def test_auto_dtype_is_checked_as_the_engine_will_settle_it(tmp_path, own, refused):
    """On CUDA, engine.dtype=auto runs the checkpoint's half precision as it is, and fp32 (or wider) as
    fp32, which xformers refuses (memory_plan's rule)."""
    overrides = XF + ["engine.dtype=auto", f"model.path={checkpoint(tmp_path / 'm', own)}"]
    if refused:
        with pytest.raises(ConfigError, match="engine.dtype=float32"):
            compose(overrides)
    else:
        compose(overrides)


@pytest.mark.parametrize("overrides", [
    XF,                                                        # the shipped cuda group: block 64, bf16
    ["pipeline=llava_chat", "engine=cuda", "engine.block_size=16"],  # auto: falls back, never refused
    ["pipeline=llava_chat", "engine.attention_backend=cpu"],
])
def test_configs_that_can_run_compose(overrides):
    compose(overrides)


@pytest.mark.parametrize("overrides, fragment", [
    (["pipeline=llava_chat", "engine=cuda", "engine.attention_backend=cpu"],
     "engine.attention_backend=cpu needs engine.device=cpu"),
    (["pipeline=llava_chat", "engine.block_size=0"], "engine.block_size: 0; allowed: 1 or more"),
])
def test_other_impossible_engine_settings(overrides, fragment):
    with pytest.raises(ConfigError, match=fragment):
        compose(overrides)


def test_appliance_check_prints_one_line():
    result = run_cli("check", *XF, "engine.block_size=16")
    assert_user_error(result, "engine.block_size=16", "multiple of 64")
