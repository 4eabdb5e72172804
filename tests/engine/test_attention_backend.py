"""Which attention backend `engine.attention_backend` gets (the name the kernel plan keeps), decided without
a GPU: the xformers path is driven with a stand-in fmha module and a stand-in probe (the probe itself:
test_xformers_backend)."""
import importlib.util
import logging

import pytest
import torch

from appliance.engine import cpu_kernels
from appliance.engine.attention import CpuAttentionBackend, TorchAttentionBackend
from appliance.engine.attention_geometry import AttentionGeometry
from appliance.engine.attention_select import make_backend, select_backend
from appliance.engine.config import AttentionBackend, EngineConfig
from appliance.engine.xformers_attention import XformersAttentionBackend
from tests.engine.fake_fmha import fake_fmha

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
GEOMETRY = AttentionGeometry(num_heads=4, num_kv_heads=2, head_dim=64, block_size=64)


def passing_probe(backend, geometry, device, dtype):
    return None


def failing_probe(backend, geometry, device, dtype):
    return "decode step failed: NotImplementedError: No operator found for `memory_efficient_attention_forward`"


def xformers(name, dtype, geometry=GEOMETRY, probe=passing_probe):
    return select_backend(name, CUDA, dtype, geometry, probe=probe, fmha=fake_fmha())


needs_cpu_kernels = pytest.mark.skipif(not cpu_kernels.available(),
                                       reason=f"CPU kernels unavailable: {cpu_kernels.unavailable_reason()}")


@pytest.mark.parametrize("dtype, expected", [
    (torch.float32, "torch"),      # xformers' decode kernel is fp16/bf16 only
    (torch.bfloat16, "xformers"),
    (torch.float16, "xformers"),
])
def test_auto_on_cuda_picks_xformers_only_where_it_runs(dtype, expected):
    assert xformers(AttentionBackend.auto, dtype) == expected


@pytest.mark.parametrize("name, kind", [("torch", TorchAttentionBackend), ("cpu", CpuAttentionBackend),
                                        ("xformers", XformersAttentionBackend)])
def test_each_runner_makes_its_own_backend_of_the_name(name, kind):
    first, second = make_backend(name, fake_fmha()), make_backend(name, fake_fmha())
    assert type(first) is kind and first.name == name and first is not second


def test_auto_with_a_block_size_xformers_refuses_falls_back_with_one_line(caplog):
    with caplog.at_level(logging.INFO, logger="appliance.engine.attention"):
        backend = xformers(AttentionBackend.auto, torch.bfloat16, AttentionGeometry(4, 2, 64, 16))
    assert backend == "torch"
    assert len(caplog.records) == 1
    assert "engine.block_size=16" in caplog.text and "multiple of 64" in caplog.text


def test_auto_falls_back_when_the_probe_fails_and_says_why(caplog):
    with caplog.at_level(logging.INFO, logger="appliance.engine.attention"):
        backend = xformers(AttentionBackend.auto, torch.float16, probe=failing_probe)
    assert backend == "torch"
    [record] = caplog.records
    assert record.levelno == logging.WARNING and "No operator found" in record.getMessage()
    assert "using the torch backend" in record.getMessage()


def test_explicit_xformers_fails_at_start_with_the_probe_reason():
    with pytest.raises(ValueError, match="cannot run here: decode step failed: NotImplementedError"):
        xformers(AttentionBackend.xformers, torch.float16, probe=failing_probe)


@pytest.mark.parametrize("dtype, geometry, message", [
    (torch.float32, GEOMETRY, "engine.dtype=float32"),
    (torch.float16, AttentionGeometry(4, 2, 64, 16), "engine.block_size=16"),
    (torch.float16, AttentionGeometry(4, 2, 80, 64), "head dim 80"),
])
def test_explicit_xformers_that_cannot_run_names_the_constraint(dtype, geometry, message):
    with pytest.raises(ValueError, match=message):
        xformers(AttentionBackend.xformers, dtype, geometry)


def test_explicit_xformers_on_cpu_is_a_clear_error():
    with pytest.raises(ValueError, match="needs a CUDA device"):
        select_backend(AttentionBackend.xformers, CPU, torch.float16, GEOMETRY, probe=passing_probe, fmha=fake_fmha())


def test_auto_on_cuda_without_xformers_is_torch():
    if importlib.util.find_spec("xformers") is not None:
        pytest.skip("xformers is installed here")
    assert select_backend(AttentionBackend.auto, CUDA, torch.bfloat16, GEOMETRY) == "torch"
    with pytest.raises(ValueError, match="xformers is not installed"):
        select_backend(AttentionBackend.xformers, CUDA, torch.bfloat16, GEOMETRY)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_auto_on_cpu_never_probes(dtype):
    assert select_backend(AttentionBackend.auto, CPU, dtype, probe=failing_probe) == "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_auto_picks_our_cpu_kernel_for_fp32_and_bf16_on_cpu(dtype):
    assert select_backend(AttentionBackend.auto, CPU, dtype) == "cpu"
    assert select_backend(AttentionBackend.auto, CPU, torch.float16) == "torch"


def test_auto_is_torch_on_cpu_with_cpu_kernels_off():
    off = "engine.cpu_kernels=false"
    assert select_backend(AttentionBackend.auto, CPU, torch.float32, cpu_kernels_off=off) == "torch"


@pytest.mark.parametrize("device, dtype, message", [
    (CPU, torch.float16, "needs engine.device=cpu and engine.dtype float32 or bfloat16"),
    (CUDA, torch.float32, "needs engine.device=cpu and engine.dtype float32 or bfloat16"),
])
def test_cpu_backend_where_it_cannot_run_is_a_clear_error(device, dtype, message):
    with pytest.raises(ValueError, match=message):
        select_backend(AttentionBackend.cpu, device, dtype)


def test_cpu_backend_with_kernels_off_says_why():
    with pytest.raises(ValueError, match=r"unavailable \(no compiler\)"):
        select_backend(AttentionBackend.cpu, CPU, torch.float32, cpu_kernels_off="no compiler")


def test_unknown_backend_names_the_choices():
    with pytest.raises(ValueError, match="engine.attention_backend: 'flash' is not one of auto, torch, cpu, xformers"):
        EngineConfig(attention_backend="flash")
    with pytest.raises(TypeError, match="expected an AttentionBackend member, got 'auto'"):
        select_backend("auto", CPU)  # a name reaching it unconverted is a bug, never a silent choice


@needs_cpu_kernels
def test_bf16_decode_on_our_kernel_matches_the_torch_backend(llama_dir):
    """bf16 engines on CPU decode with our kernel reading the bf16 cache in place (no gathered copy);
    the torch backend's gathered attention is the reference."""
    from appliance.engine.config import EngineConfig
    from appliance.engine.llm_engine import LLMEngine
    from appliance.engine.sampling_params import SamplingParams
    from tests.engine.helpers import random_prompts

    prompts = random_prompts(400, [3, 20, 47, 70], seed=41)
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)
    outs = {}
    for backend in ("cpu", "torch"):
        engine = LLMEngine(llama_dir, EngineConfig(dtype="bfloat16", attention_backend=backend, num_kv_blocks=64))
        assert engine.executor.runner.attn_backend.name == backend
        outs[backend] = engine.generate(prompts, greedy)
    for ours, torch_ in zip(outs["cpu"], outs["torch"]):
        same = next((i for i, (a, b) in enumerate(zip(ours.token_ids, torch_.token_ids)) if a != b), 12)
        assert same >= 4, "bf16 rounding may flip a late near-tie, never the first tokens"
        for i in range(same):
            assert abs(ours.logprobs[i][ours.token_ids[i]] - torch_.logprobs[i][torch_.token_ids[i]]) < 0.05
