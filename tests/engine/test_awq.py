"""AWQ checkpoints (GEMM layout) load as int4 weights: the loaded weights against the format's own formula
computed here from the raw tensors, an engine's greedy tokens against the same model with those weights
dense, and the settings and checkpoints refused, by `check` as by `run`."""
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from appliance.cli import main
from appliance.config.compose import compose
from appliance.engine.config import EngineConfig
from appliance.engine.linear import ColumnParallelLinear, RowParallelLinear
from appliance.errors import ConfigError
from tests.engine.helpers import write_awq_checkpoint
from tests.servers import LLAVA_TINY

FP32_PLAN = ["avx512_bf16", "amx_bf16"]  # off: the int4 kernel's scales and zeros in fp32 on any host
REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # the nibble that holds each of eight columns (vLLM's name for it)
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


@pytest.fixture(scope="module")
def awq32(tmp_path_factory):
    return write_awq_checkpoint(tmp_path_factory.mktemp("awq") / "g32", 32)


def formula(raw, layer, group_size):
    """(w [out, in] = (q - z) · s per the format, from `layer`'s qweight, qzeros and scales, in float64;
    the scale of each weight [out, in])."""
    def unpack(packed):
        values = torch.empty(packed.shape[0], packed.shape[1] * 8, dtype=torch.int64)
        for column, nibble in enumerate(REVERSE_ORDER):
            values[:, column::8] = (packed.long() >> (4 * nibble)) & 15
        return values

    q, z = unpack(raw[f"{layer}.qweight"]), unpack(raw[f"{layer}.qzeros"]).repeat_interleave(group_size, 0)
    s = raw[f"{layer}.scales"].double().repeat_interleave(group_size, 0)
    return ((q - z) * s).t(), s.t()


def loaded_and_formula(engine, path, group_size):
    """(name, each projection's weight as the engine holds it dequantised in fp32, the format's formula,
    each weight's scale)."""
    raw = load_file(str(path / "model.safetensors"))
    for name, m in engine.executor.runner.model.named_modules():
        if isinstance(m, (ColumnParallelLinear, RowParallelLinear)):
            prefix, own = name.rsplit(".", 1)
            parts = [formula(raw, f"{prefix}.{part}", group_size) for part in FUSED.get(own, (own,))]
            yield name, m.quantized.dequantized(torch.float32).double(), torch.cat([w for w, _ in parts]), \
                torch.cat([s for _, s in parts])


@pytest.mark.parametrize("group_size", [32, 128])
def test_the_loaded_weights_are_the_formats_to_the_bit_in_fp32(tmp_path, group_size):
    from appliance.engine.llm_engine import LLMEngine

    path = write_awq_checkpoint(tmp_path / "awq", group_size)
    engine = LLMEngine(str(path), EngineConfig(dtype="float32", num_kv_blocks=16, cpu_features_off=FP32_PLAN))
    assert engine.cfg.quantization.value == "int4" and engine.kernels.int4.group_size == group_size
    pairs = list(loaded_and_formula(engine, path, group_size))
    assert len(pairs) == 8  # 2 layers: qkv, o, gate_up, down
    for name, loaded, expected, _ in pairs:
        assert torch.equal(loaded, expected), name


def test_bf16_rounds_each_scale_and_zero_term_once(awq32):
    """A bf16 engine holds s and (8 - z) · s in bf16, each rounded once (at most 2^-9 relative): a weight
    (q - 8) · s + (8 - z) · s is off by at most 16 · s · 2^-9; the bound here is twice that."""
    from appliance.engine.llm_engine import LLMEngine

    engine = LLMEngine(str(awq32), EngineConfig(dtype="bfloat16", num_kv_blocks=16))
    worst = 0.0
    for name, loaded, expected, scale in loaded_and_formula(engine, awq32, 32):
        error = (loaded - expected).abs()
        assert bool((error <= 16 * scale * 2 ** -8).all()), name  # |q - 8| + |8 - z| <= 16
        worst = max(worst, float(error.max()))
    assert worst > 0  # it does round


def test_an_awq_llava_answers_as_its_dense_weights_do(awq32):
    """The AWQ checkpoint's engine gives the greedy tokens of the source model with every projection
    replaced by the format's dequantised weights (fp32, torch's kernels both)."""
    from appliance.engine.llm_engine import LLMEngine
    from appliance.engine.sampling_params import SamplingParams
    from tests.engine.helpers import random_prompts

    prompts = random_prompts(399, [5, 17, 30, 9, 12, 23], seed=41)
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    base = dict(num_kv_blocks=64, dtype="float32", cpu_kernels=False, cpu_features_off=FP32_PLAN)
    awq = LLMEngine(str(awq32), EngineConfig(**base))
    awq_tokens = [a.token_ids for a in awq.generate(prompts, greedy)]

    dense = LLMEngine(str(LLAVA_TINY), EngineConfig(quantization="none", **base))
    weights = {name: expected for name, _, expected, _ in loaded_and_formula(awq, awq32, 32)}
    for name, m in dense.executor.runner.model.named_modules():
        if name in weights:
            m.weight.data = weights.pop(name).float()
    assert not weights
    assert [a.token_ids for a in dense.generate(prompts, greedy)] == awq_tokens


def variant(tmp_path, source, **quant):
    """A copy of `source` whose quantization_config has `quant` changed."""
    out = tmp_path / "variant"
    shutil.copytree(source, out)
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"].update(quant)
    (out / "config.json").write_text(json.dumps(config))
    return out


def refused_alike(args, message: str, capsys) -> None:
    """Composing `args` raises `message`, and `check` and `run` print it as their one error line (exit 2)."""
    with pytest.raises(ConfigError) as e:
        compose(args)
    assert str(e.value) == message
    for verb in ("check", "run"):
        assert main([verb, *args, "prompt=What color is the shape?"]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert lines == [f"appliance {verb}: error: {message}"]


QUANT_FIELD = "config.json quantization_config"


@pytest.mark.parametrize("quant, overrides, refusal", [
    ({}, ["engine.quantization=int8"], "engine.quantization=int8 conflicts with {path}, an AWQ checkpoint (4-bit): "
                                       "it runs int4; use engine.quantization=int4 or auto"),
    ({}, ["engine.quantization=none"], "engine.quantization=none conflicts with {path}, an AWQ checkpoint (4-bit): "
                                       "it runs int4; use engine.quantization=int4 or auto"),
    ({"bits": 8}, [], f"{{path}}/{QUANT_FIELD}.bits=8: AWQ checkpoints load with 4 bits only"),
    ({"version": "gemv"}, [], f"{{path}}/{QUANT_FIELD}.version=gemv: only AWQ's GEMM layout loads (version gemm)"),
    ({"zero_point": False}, [], f"{{path}}/{QUANT_FIELD}.zero_point=False: only AWQ with zero points loads"),
    ({"group_size": 256}, [], f"{{path}}/{QUANT_FIELD}.group_size=256: int4 takes groups of 32, 64, 128"),
    ({"group_size": -1}, [], f"{{path}}/{QUANT_FIELD}.group_size=-1: int4 takes groups of 32, 64, 128"),
    ({"group_size": 128}, ["engine.tensor_parallel_size=2"],
     "{path}, an AWQ checkpoint in groups of 128, cannot run on engine.tensor_parallel_size=2: "
     "language_model.model.layers.0.mlp.down_proj has 192 input features per rank, not a multiple of the "
     "checkpoint's 128; use a smaller engine.tensor_parallel_size"),
])
def test_check_and_run_refuse_what_the_engine_cannot_load(tmp_path, awq32, capsys, quant, overrides, refusal):
    path = variant(tmp_path, awq32, **quant)
    refused_alike(["pipeline=llava_chat", f"model.path={path}", *overrides], refusal.format(path=path), capsys)


def test_modules_not_converted_load_quantised_in_the_checkpoints_groups(tmp_path):
    """Layers named in modules_to_not_convert hold plain weights: a decoder projection among them runs
    int4 in the checkpoint's groups, as int4 at load quantises it, beside the format's own layers (k
    beside quantised q and v, fused)."""
    from appliance.engine.int4 import Int4Weight
    from appliance.engine.llm_engine import LLMEngine

    plain = ("language_model.model.layers.0.self_attn.k_proj", "language_model.model.layers.1.mlp.down_proj")
    path = write_awq_checkpoint(tmp_path / "awq", 32, keep=plain)
    assert json.loads((path / "config.json").read_text())["quantization_config"]["modules_to_not_convert"] == \
        list(plain)
    engine = LLMEngine(str(path), EngineConfig(dtype="float32", num_kv_blocks=16, cpu_features_off=FP32_PLAN))
    raw = load_file(str(path / "model.safetensors"))
    for name, m in engine.executor.runner.model.named_modules():
        if isinstance(m, (ColumnParallelLinear, RowParallelLinear)):
            prefix, own = name.rsplit(".", 1)
            layers = [f"{prefix}.{part}" for part in FUSED.get(own, (own,))]
            expected = [Int4Weight(raw[f"{layer}.weight"], engine.kernels.int4).dequantized(torch.float32).double()
                        if layer in plain else formula(raw, layer, 32)[0] for layer in layers]
            assert torch.equal(m.quantized.dequantized(torch.float32).double(), torch.cat(expected)), name


def test_the_engine_settles_an_awq_checkpoint_as_check_does(awq32):
    from appliance.engine.llm_engine import LLMEngine

    assert compose(["pipeline=llava_chat", f"model.path={awq32}", "engine.quantization=int4"])
    with pytest.raises(ConfigError, match="engine.quantization=int8 conflicts with"):
        LLMEngine(str(awq32), EngineConfig(quantization="int8", num_kv_blocks=16))
    plain = LLMEngine(str(LLAVA_TINY), EngineConfig(num_kv_blocks=16))  # auto, not AWQ: unquantized
    assert plain.cfg.quantization.value == "none" and plain.kernels.int4 is None


def test_the_memory_plan_counts_an_awq_checkpoint_as_the_weights_it_loads(awq32):
    """Its projections load dense (q in the engine's dtype) before they are packed, as int4 at load does:
    the plan reads the same facts from the AWQ headers as from the source checkpoint's."""
    from appliance.engine.checkpoint_facts import hf_checkpoint_facts

    awq, source = hf_checkpoint_facts(str(awq32)), hf_checkpoint_facts(str(LLAVA_TINY))
    assert awq.projection_elements == source.projection_elements > 0
    assert awq.weight_bytes(torch.bfloat16, int4_group=32) == source.weight_bytes(torch.bfloat16, int4_group=32)
    assert awq.weight_bytes(torch.bfloat16) == source.weight_bytes(torch.bfloat16)


def test_transformers_5_names_load_the_same_weights(tmp_path, awq32):
    """Checkpoints name the language model `language_model.model.layers...` (transformers 4) or
    `model.language_model.layers...` (5): both load, to the same weights."""
    from safetensors.torch import save_file

    from appliance.engine.llm_engine import LLMEngine

    renamed = tmp_path / "renamed"
    shutil.copytree(awq32, renamed)
    tensors = load_file(str(awq32 / "model.safetensors"))
    moved = {("lm_head." + name[len("language_model.lm_head."):] if name.startswith("language_model.lm_head.")
              else "model." + name.replace("language_model.model.", "language_model.", 1)): t
             for name, t in tensors.items()}
    assert any(name.startswith("model.language_model.layers.0.") and name.endswith(".qweight") for name in moved)
    save_file(moved, str(renamed / "model.safetensors"))
    cfg = EngineConfig(dtype="float32", num_kv_blocks=16, cpu_features_off=FP32_PLAN)
    weights = [list(loaded_and_formula(LLMEngine(str(path), cfg), awq32, 32)) for path in (awq32, renamed)]
    for (name, a, expected, _), (_, b, _, _) in zip(*weights):
        assert torch.equal(a, b) and torch.equal(a, expected), name


def test_two_ranks_load_their_shards_of_the_groups_and_answer_as_one(awq32):
    """The group scales and zeros load through the projections' own weight loaders: column-parallel ones
    by output rows, row-parallel ones by input groups, q/k/v and gate/up fused."""
    from appliance.engine.llm_engine import LLMEngine
    from appliance.engine.sampling_params import SamplingParams
    from tests.engine.helpers import random_prompts

    prompts = random_prompts(399, [7, 4, 19], seed=43)
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    answers = {}
    for ranks in (1, 2):
        cfg = EngineConfig(num_kv_blocks=32, dtype="bfloat16", tensor_parallel_size=ranks)
        answers[ranks] = [a.token_ids for a in LLMEngine(str(awq32), cfg).generate(prompts, greedy)]
    assert answers[2] == answers[1]
