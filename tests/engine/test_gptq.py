"""GPTQ checkpoints load as int4 weights: the loaded weights against the format's own formula computed here
from the raw tensors (common and v2 zeros, symmetric and asymmetric groups), an engine's greedy tokens
against the same model with those weights dense, and the settings and checkpoints refused."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from appliance.cli import main
from appliance.config.compose import compose
from appliance.engine.config import EngineConfig
from appliance.engine.int4 import Int4Weight
from appliance.engine.linear import ColumnParallelLinear, RowParallelLinear
from appliance.errors import ConfigError
from tests.engine.helpers import write_gptq_checkpoint
from tests.engine.test_awq import FP32_PLAN, FUSED, QUANT_FIELD, refused_alike, variant
from tests.servers import LLAVA_TINY

ATTENTION = "language_model.model.layers.0.self_attn"
SYMMETRIC_ZEROS = 0x77777777  # eight stored zeros of 7: the zero 8 less AutoGPTQ's 1


@pytest.fixture(scope="module")
def gptq32(tmp_path_factory):
    return write_gptq_checkpoint(tmp_path_factory.mktemp("gptq") / "g32", 32)


def formula(raw, layer, zero_offset):
    """w [out, in] = (q - z) · s per the format, from `layer`'s qweight, qzeros, scales and g_idx, in float64
    (z: the stored zero plus `zero_offset`)."""
    packed, g_idx = raw[f"{layer}.qweight"].long(), raw[f"{layer}.g_idx"].long()
    q = torch.empty(packed.shape[0] * 8, packed.shape[1], dtype=torch.int64)
    for j in range(8):
        q[j::8] = (packed >> (4 * j)) & 15  # input 8i + j in nibble j of row i
    zeros = raw[f"{layer}.qzeros"].long()
    z = torch.empty(zeros.shape[0], zeros.shape[1] * 8, dtype=torch.int64)
    for j in range(8):
        z[:, j::8] = ((zeros >> (4 * j)) & 15) + zero_offset  # output 8c + j in nibble j of column c
    return ((q - z[g_idx]) * raw[f"{layer}.scales"].double()[g_idx]).t()


def loaded_and_expected(engine, path, zero_offset, plain=()):
    """(name, each projection's weight as the engine holds it dequantised in fp32, the format's formula
    for its quantised parts and, for the `plain` ones the checkpoint left unquantised, int4 at load)."""
    raw = load_file(str(path / "model.safetensors"))
    plan = engine.kernels.int4
    for name, m in engine.executor.runner.model.named_modules():
        if isinstance(m, (ColumnParallelLinear, RowParallelLinear)):
            prefix, own = name.rsplit(".", 1)
            layers = [f"{prefix}.{part}" for part in FUSED.get(own, (own,))]
            expected = [Int4Weight(raw[f"{layer}.weight"], plan).dequantized(torch.float32).double()
                        if layer in plain else formula(raw, layer, zero_offset) for layer in layers]
            yield name, m.quantized.dequantized(torch.float32).double(), torch.cat(expected)


@pytest.mark.parametrize("group_size, options, zero_offset", [
    (32, {}, 1),
    (128, {"sym": True}, 1),
    (64, {"v2": True}, 0),
    (32, {"sym": True, "v2": True}, 0),
])
def test_the_loaded_weights_are_the_formats_to_the_bit_in_fp32(tmp_path, group_size, options, zero_offset):
    from appliance.engine.llm_engine import LLMEngine

    path = write_gptq_checkpoint(tmp_path / "gptq", group_size, **options)
    raw = load_file(str(path / "model.safetensors"))
    stored = raw[f"{ATTENTION}.q_proj.qzeros"]
    if options.get("sym"):  # every zero 8, stored as the format stores it
        assert bool((stored == (SYMMETRIC_ZEROS if zero_offset else 0x88888888 - 2 ** 32)).all())
    else:
        assert stored.unique().numel() > 1
    engine = LLMEngine(str(path), EngineConfig(dtype="float32", num_kv_blocks=16, cpu_features_off=FP32_PLAN))
    assert engine.cfg.quantization.value == "int4" and engine.kernels.int4.group_size == group_size
    pairs = list(loaded_and_expected(engine, path, zero_offset))
    assert len(pairs) == 8  # 2 layers: qkv, o, gate_up, down
    for name, loaded, expected in pairs:
        assert torch.equal(loaded, expected), name


def test_layers_left_plain_load_quantised_in_the_checkpoints_groups(tmp_path):
    """A projection the writer skipped holds its plain weight: it runs int4 in the checkpoint's groups, as
    int4 at load quantises it, beside the format's own layers (k beside quantised q and v, fused)."""
    from appliance.engine.llm_engine import LLMEngine

    plain = (f"{ATTENTION}.k_proj", "language_model.model.layers.1.mlp.down_proj")
    path = write_gptq_checkpoint(tmp_path / "gptq", 32, keep=plain)
    engine = LLMEngine(str(path), EngineConfig(dtype="float32", num_kv_blocks=16, cpu_features_off=FP32_PLAN))
    for name, loaded, expected in loaded_and_expected(engine, path, 1, plain):
        assert torch.equal(loaded, expected), name


def test_a_gptq_llava_answers_as_its_dense_weights_do(gptq32):
    """The GPTQ checkpoint's engine gives the greedy tokens of the source model with every projection
    replaced by the format's dequantised weights (fp32, torch's kernels both)."""
    from appliance.engine.llm_engine import LLMEngine
    from appliance.engine.sampling_params import SamplingParams
    from tests.engine.helpers import random_prompts

    prompts = random_prompts(399, [5, 17, 30, 9, 12, 23], seed=47)
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    base = dict(num_kv_blocks=64, dtype="float32", cpu_kernels=False, cpu_features_off=FP32_PLAN)
    gptq = LLMEngine(str(gptq32), EngineConfig(**base))
    gptq_tokens = [a.token_ids for a in gptq.generate(prompts, greedy)]

    dense = LLMEngine(str(LLAVA_TINY), EngineConfig(quantization="none", **base))
    weights = {name: expected for name, _, expected in loaded_and_expected(gptq, gptq32, 1)}
    for name, m in dense.executor.runner.model.named_modules():
        if name in weights:
            m.weight.data = weights.pop(name).float()
    assert not weights
    assert [a.token_ids for a in dense.generate(prompts, greedy)] == gptq_tokens


@pytest.mark.parametrize("quant, overrides, refusal", [
    ({}, ["engine.quantization=int8"], "engine.quantization=int8 conflicts with {path}, a GPTQ checkpoint (4-bit): "
                                       "it runs int4; use engine.quantization=int4 or auto"),
    ({"bits": 8}, [], f"{{path}}/{QUANT_FIELD}.bits=8: GPTQ checkpoints load with 4 bits only"),
    ({"group_size": -1}, [], f"{{path}}/{QUANT_FIELD}.group_size=-1: int4 takes groups of 32, 64, 128"),
    ({"checkpoint_format": "marlin"}, [],
     f"{{path}}/{QUANT_FIELD}.checkpoint_format=marlin: only GPTQ's own layouts load (gptq or gptq_v2)"),
    ({"lm_head": True}, [], f"{{path}}/{QUANT_FIELD}.lm_head=True: only the decoder's projections load "
                            f"quantised (an LM head in GPTQ does not)"),
    ({"quant_method": "bitsandbytes"}, [],
     f"{{path}}/{QUANT_FIELD}.quant_method=bitsandbytes: only awq and gptq checkpoints load quantised"),
    ({"group_size": 128}, ["engine.tensor_parallel_size=2"],
     "{path}, a GPTQ checkpoint in groups of 128, cannot run on engine.tensor_parallel_size=2: "
     "language_model.model.layers.0.mlp.down_proj has 192 input features per rank, not a multiple of the "
     "checkpoint's 128; use a smaller engine.tensor_parallel_size"),
])
def test_check_and_run_refuse_what_the_engine_cannot_load(tmp_path, gptq32, capsys, quant, overrides, refusal):
    path = variant(tmp_path, gptq32, **quant)
    refused_alike(["pipeline=llava_chat", f"model.path={path}", *overrides], refusal.format(path=path), capsys)


def test_groups_in_activation_order_are_refused_by_name(tmp_path, gptq32, capsys):
    """desc_act: a g_idx that is not input // G (inputs quantised in activation order) names the field and
    the layer, by `check` from the g_idx tensors as by the engine as the layer loads; the same flag with
    groups in input order (static groups) loads."""
    from appliance.engine.llm_engine import LLMEngine

    path = variant(tmp_path, gptq32, desc_act=True)
    args = ["pipeline=llava_chat", f"model.path={path}"]
    assert compose(args)
    cfg = EngineConfig(dtype="float32", num_kv_blocks=16, cpu_features_off=FP32_PLAN)
    assert LLMEngine(str(path), cfg).cfg.quantization.value == "int4"
    tensors = load_file(str(path / "model.safetensors"))
    g_idx = tensors[f"{ATTENTION}.q_proj.g_idx"]
    order = torch.randperm(g_idx.numel(), generator=torch.Generator().manual_seed(0))
    tensors[f"{ATTENTION}.q_proj.g_idx"] = g_idx[order]
    save_file(tensors, str(path / "model.safetensors"))
    message = (f"{path}/{QUANT_FIELD}.desc_act=True: {ATTENTION}.q_proj.g_idx puts inputs in groups out of "
               f"input order (activation order); only GPTQ whose groups follow the inputs loads")
    with pytest.raises(ConfigError) as e:
        LLMEngine(str(path), cfg)
    assert str(e.value) == message and e.value.param == "model.path"
    with pytest.raises(ConfigError, match="desc_act=True"):
        compose(args)
    assert main(["check", *args]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"appliance check: error: {message}"]


def test_a_zero_bias_beside_each_layer_loads_as_if_absent(tmp_path, gptq32):
    """AutoGPTQ's exports store an all-zero bias beside every layer, also where the model has none (Llama's
    projections): it is dropped, and the engine answers as on the same checkpoint without it, token for token
    and logprob for logprob."""
    from appliance.engine.llm_engine import LLMEngine
    from appliance.engine.sampling_params import SamplingParams
    from tests.engine.helpers import random_prompts

    path = write_gptq_checkpoint(tmp_path / "gptq", 32, zero_bias=True)
    raw = load_file(str(path / "model.safetensors"))
    layers = [name.rsplit(".", 1)[0] for name in raw if name.endswith(".qweight")]
    assert len(layers) == 14 and all(not raw[f"{layer}.bias"].any() for layer in layers)
    assert compose(["pipeline=llava_chat", f"model.path={path}"])
    prompts = random_prompts(399, [5, 17, 30], seed=59)
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=5)
    cfg = EngineConfig(num_kv_blocks=32, dtype="float32", cpu_features_off=FP32_PLAN)
    answers = [[(a.token_ids, a.logprobs) for a in LLMEngine(str(checkpoint), cfg).generate(prompts, greedy)]
               for checkpoint in (path, gptq32)]
    assert answers[0] == answers[1]


def test_a_bias_the_model_has_no_place_for_is_refused_by_name(tmp_path, capsys):
    """A bias that is not all zeros, beside a layer the model gives none, names the tensor and the model's
    flag, by `check` from the bias tensors as by the engine as the weights load."""
    from appliance.engine.llm_engine import LLMEngine

    path = write_gptq_checkpoint(tmp_path / "gptq", 32, zero_bias=True)
    tensors = load_file(str(path / "model.safetensors"))
    name = "language_model.model.layers.1.mlp.down_proj.bias"
    tensors[name][5] = 0.25
    save_file(tensors, str(path / "model.safetensors"))
    message = (f"{path}: {name} is not all zeros, but the model's down_proj has no bias (mlp_bias is false); "
               f"a GPTQ checkpoint loads a projection's bias only where the model has one")
    refused_alike(["pipeline=llava_chat", f"model.path={path}"], message, capsys)
    with pytest.raises(ConfigError) as e:
        LLMEngine(str(path), EngineConfig(dtype="float32", num_kv_blocks=16, cpu_features_off=FP32_PLAN))
    assert str(e.value) == message and e.value.param == "model.path"


def test_a_bias_the_model_has_loads_as_it_is(tmp_path):
    """Where the model gives a projection a bias (attention_bias), the checkpoint's loads into it."""
    from appliance.engine.llm_engine import LLMEngine

    path = write_gptq_checkpoint(tmp_path / "gptq", 32, zero_bias=True)
    config = json.loads((path / "config.json").read_text())
    config["text_config"]["attention_bias"] = True
    (path / "config.json").write_text(json.dumps(config))
    tensors = load_file(str(path / "model.safetensors"))
    bias = torch.randn(tensors[f"{ATTENTION}.o_proj.bias"].shape).half()
    tensors[f"{ATTENTION}.o_proj.bias"] = bias
    save_file(tensors, str(path / "model.safetensors"))
    assert compose(["pipeline=llava_chat", f"model.path={path}"])
    engine = LLMEngine(str(path), EngineConfig(dtype="float32", num_kv_blocks=16, cpu_features_off=FP32_PLAN))
    o_proj = engine.executor.runner.model.get_submodule(f"{ATTENTION}.o_proj")
    assert torch.equal(o_proj.bias, bias.float())


def test_the_memory_plan_counts_a_gptq_checkpoint_as_the_weights_it_loads(gptq32):
    from appliance.engine.checkpoint_facts import hf_checkpoint_facts

    gptq, source = hf_checkpoint_facts(str(gptq32)), hf_checkpoint_facts(str(LLAVA_TINY))
    assert gptq.projection_elements == source.projection_elements > 0
    assert gptq.weight_bytes(torch.bfloat16, int4_group=32) == source.weight_bytes(torch.bfloat16, int4_group=32)


def test_two_ranks_load_their_shards_of_the_groups_and_answer_as_one(gptq32):
    from appliance.engine.llm_engine import LLMEngine
    from appliance.engine.sampling_params import SamplingParams
    from tests.engine.helpers import random_prompts

    assert compose(["pipeline=llava_chat", f"model.path={gptq32}", "engine.tensor_parallel_size=2"])
    prompts = random_prompts(399, [7, 4, 19], seed=53)
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    answers = {}
    for ranks in (1, 2):
        cfg = EngineConfig(num_kv_blocks=32, dtype="bfloat16", tensor_parallel_size=ranks)
        answers[ranks] = [a.token_ids for a in LLMEngine(str(gptq32), cfg).generate(prompts, greedy)]
    assert answers[2] == answers[1]
