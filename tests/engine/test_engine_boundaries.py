"""The engine's edges: what it imports, and the contract a model class must fulfil."""
import json
import subprocess
import sys

import pytest
import torch

from appliance.engine.config import EngineConfig, EngineKind
from appliance.engine.models import MODEL_REGISTRY, get_model_class, model_architecture
from appliance.engine.models.base import CausalLM

BLOCK = ("import sys, pkgutil, importlib\n"
         "for name in {blocked!r}: sys.modules[name] = None  # importing it raises ImportError\n")


def run_python(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_engine_imports_without_hydra_or_request_side_code():
    """Every engine module imports with Hydra, OmegaConf and the request side (vision, fetch, stages,
    serving, protocol, config) made unimportable."""
    blocked = ["hydra", "omegaconf", "appliance.config", "appliance.vision", "appliance.fetch",
               "appliance.stages", "appliance.serving", "appliance.protocol", "appliance.pipeline"]
    code = BLOCK.format(blocked=blocked) + (
        "import appliance.engine as e\n"
        "names = [m.name for m in pkgutil.walk_packages(e.__path__, 'appliance.engine.')]\n"
        "for n in names: importlib.import_module(n)\n"
        "print(len(names))\n")
    assert int(run_python(code)) > 20


def test_pool_path_imports_no_generation_stack():
    """PoolEngine and a pool model load without transformers or the generate engine's modules (our CPU
    kernels are the pool engine's too: its kernel plan packs its model's linear layers)."""
    code = BLOCK.format(blocked=["transformers", "hydra", "omegaconf"]) + (
        "from appliance.engine.pool_engine import PoolEngine\n"
        "from appliance.engine.config import EngineKind\n"
        "from appliance.engine.models import get_model_class\n"
        "get_model_class('PrithviSegmentation', EngineKind.pool)\n"
        "gen = [m for m in ('llm_engine', 'model_runner', 'scheduler', 'attention', 'sampler')\n"
        "       if 'appliance.engine.' + m in sys.modules]\n"
        "print(gen)\n")
    assert run_python(code).strip() == "[]"


GENERATE, POOL = EngineKind.generate, EngineKind.pool


@pytest.mark.parametrize("architecture, kind, message", [
    # the shipped architectures, sorted (test plugins may have registered more in this process)
    ("FooForCausalLM", GENERATE, "unknown model architecture 'FooForCausalLM'; registered: (.*, )?LlamaForCausalLM, "
                                 "LlavaForConditionalGeneration, LlavaNextForConditionalGeneration, "
                                 "MistralForCausalLM, PrithviSegmentation"),
    ("PrithviSegmentation", GENERATE, "is not a generating model; run it with engine.kind=pool"),
    ("LlamaForCausalLM", POOL, "has no pool mode; run it with engine.kind=generate"),
    ("LlavaNextForConditionalGeneration", POOL, "has no pool mode"),
])
def test_registry_refuses_clearly(architecture, kind, message):
    with pytest.raises(ValueError, match=message):
        get_model_class(architecture, kind)


@pytest.mark.parametrize("architecture, kind, expected", [
    ("MistralForCausalLM", GENERATE, "LlamaForCausalLM"),
    ("LlavaForConditionalGeneration", GENERATE, "LlavaForConditionalGeneration"),
    ("LlavaForConditionalGeneration", POOL, "LlavaVisionEncoder"),  # pool mode on LLaVA: its vision tower
    ("PrithviSegmentation", POOL, "PrithviSegmentation"),
])
def test_registry_classes_by_kind(architecture, kind, expected):
    assert get_model_class(architecture, kind).__name__ == expected


def test_an_unknown_engine_kind_is_refused_where_the_config_is_built():
    with pytest.raises(ValueError, match="engine.kind: 'embed' is not one of generate, pool"):
        EngineConfig(kind="embed")


@pytest.mark.parametrize("declared, names, expected", [
    ("LlamaForCausalLM", ["MistralForCausalLM"], "MistralForCausalLM"),  # the checkpoint's counts
    (None, ["LlamaForCausalLM", "Other"], "LlamaForCausalLM"),  # its first
    ("PrithviSegmentation", None, "PrithviSegmentation"),  # no config.json read: model.architecture
])
def test_which_architecture_counts(declared, names, expected):
    hf_config = None if names is None else type("Config", (), {"architectures": names})()
    assert model_architecture(declared, hf_config, "/m") == expected


def test_a_config_json_naming_no_architecture_is_refused():
    with pytest.raises(ValueError, match="/m/config.json names no architecture .*LlamaForCausalLM"):
        model_architecture("LlamaForCausalLM", type("Config", (), {"architectures": None})(), "/m")


@pytest.mark.parametrize("architectures, message", [
    (["FooForCausalLM"], "unknown model architecture 'FooForCausalLM'; registered: (.*, )?LlamaForCausalLM, "),
    (None, "names no architecture"),
])
def test_engine_refuses_a_checkpoint_of_unknown_architecture(llama_dir, tmp_path, architectures, message):
    """An unknown (or absent) architecture is an error naming the registered ones, never a silent Llama."""
    import shutil

    shutil.copytree(llama_dir, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config.pop("architectures")
    if architectures:
        config["architectures"] = architectures
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    from appliance.engine.llm_engine import LLMEngine

    with pytest.raises(ValueError, match=message):
        LLMEngine(str(tmp_path / "m"), EngineConfig(num_kv_blocks=8))
    assert "FooForCausalLM" not in MODEL_REGISTRY


def test_a_model_missing_part_of_the_contract_fails_when_built():
    class NoLogits(CausalLM):
        def embed_tokens(self, input_ids):
            return input_ids

        def forward(self, input_ids, positions, ctx, inputs_embeds=None):
            return input_ids

        def attention_layers(self):
            return []

    with pytest.raises(TypeError, match="compute_logits"):
        NoLogits()


def test_engine_config_is_a_plain_dataclass():
    from appliance.config import schema
    from appliance.engine.config import engine_config_from, resolve_dtype

    assert schema.EngineConfig is EngineConfig  # the config tree's schema is the engine's own class
    assert engine_config_from({"dtype": "bfloat16"}).dtype is schema.DType.bfloat16  # typed at construction
    assert EngineConfig(kind="pool", attention_backend="torch").kind is schema.EngineKind.pool
    assert resolve_dtype(schema.DType.float16) is torch.float16
    with pytest.raises(ValueError, match="engine.dtype: 'float8' is not one of auto, float32, bfloat16, float16"):
        EngineConfig(dtype="float8")
