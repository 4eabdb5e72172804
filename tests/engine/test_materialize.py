"""Models are built on the meta device and filled once from the checkpoint: no random initialisation,
no full-precision model converted afterwards (engine/materialize.py, engine/loader.py)."""
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.overrides import TorchFunctionMode

from appliance.config.schema import EngineConfig
from appliance.engine import hugepages, loader
from appliance.engine.attention_geometry import AttentionGeometry
from appliance.engine.host import Host
from appliance.engine.kernel_plan import plan_kernels
from appliance.engine.layers import RotaryEmbedding
from appliance.engine.llm_engine import LLMEngine
from appliance.engine.materialize import build_on_meta, materialize
from appliance.engine.model_runner import ModelRunner
from appliance.engine.sampling_params import SamplingParams
from tests.engine.helpers import resident_bytes
from tests.servers import LLAVA_TINY

INIT_OPS = {"normal_", "uniform_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
            "xavier_normal_", "orthogonal_", "bernoulli_", "random_"}


class LoadRecorder(TorchFunctionMode):
    """Records random initialisation of real (non-meta) tensors and dtype conversions of parameters."""

    def __init__(self):
        super().__init__()
        self.inits, self.conversions = [], []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        first = args[0] if args else None
        if name in INIT_OPS and isinstance(first, torch.Tensor) and not first.is_meta:
            self.inits.append((name, tuple(first.shape)))
        out = func(*args, **(kwargs or {}))
        if name == "to" and isinstance(first, nn.Parameter) and isinstance(out, torch.Tensor) \
                and out.dtype != first.dtype:
            self.conversions.append((tuple(first.shape), first.dtype, out.dtype))
        return out


def test_a_bf16_engine_is_built_without_random_init_or_fp32_copy():
    """Before: the tiny LLaVA was built in fp32 with its CLIP tower and projector randomly initialised,
    then converted with module.to(bfloat16); both are gone."""
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(LLAVA_TINY)
    cfg = EngineConfig(dtype="bfloat16", cpu_kernels=False, kv_cache_memory_bytes=1 << 20)
    with LoadRecorder() as rec:
        plan = plan_kernels(cfg, Host.read(), AttentionGeometry.of(hf_config, 1, cfg.block_size))
        runner = ModelRunner(str(LLAVA_TINY), hf_config, cfg, max_model_len=512, plan=plan)
    assert rec.inits == [] and rec.conversions == []
    params = dict(runner.model.named_parameters())
    assert {p.dtype for p in params.values()} == {torch.bfloat16}
    # Filled from the checkpoint, not left uninitialised: compare against the file.
    ref = load_file(str(LLAVA_TINY / "model.safetensors"))
    name = next(k for k in ref if k.endswith("multi_modal_projector.linear_1.weight"))
    assert torch.equal(params["multi_modal_projector.linear_1.weight"], ref[name].bfloat16())


@pytest.mark.skipif(not Path("/proc/self/pagemap").exists(), reason="needs /proc/self/pagemap")
def test_the_kv_pool_holds_memory_only_where_a_run_wrote(llama_dir):
    """Before: the CPU pool was zero-filled at start, every byte of it resident before any request."""
    engine = LLMEngine(llama_dir, EngineConfig(kv_cache_memory_bytes=256 << 20))
    layers = engine.executor.runner.model.attention_layers()
    start = layers[0].k_cache.data_ptr()  # one pool: every layer's K and V, in order
    nbytes = layers[-1].v_cache.data_ptr() + layers[-1].v_cache.nbytes - start
    assert nbytes > 200 << 20 and resident_bytes(start, nbytes) == 0
    engine.generate(["the quick brown fox"], SamplingParams(max_tokens=4, ignore_eos=True))
    # The first blocks of each layer's K and V: one page each, a huge page where the host grants them.
    assert 0 < resident_bytes(start, nbytes) <= 2 * len(layers) * hugepages.HUGE_PAGE


def test_materialize_keeps_ties_and_loaders_and_runs_init_buffers():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4, bias=False)
            self.b = nn.Linear(4, 4, bias=False)
            self.b.weight = self.a.weight
            self.a.weight.weight_loader = "marker"
            self.rotary = RotaryEmbedding(8, 16)

    model = materialize(build_on_meta(Tied), torch.device("cpu"), torch.bfloat16)
    assert model.a.weight is model.b.weight and model.a.weight.weight_loader == "marker"
    assert model.a.weight.dtype == torch.bfloat16 and not model.a.weight.is_meta
    eager = RotaryEmbedding(8, 16)
    assert torch.equal(model.rotary.cos, eager.cos.bfloat16()) and torch.equal(model.rotary.sin, eager.sin.bfloat16())


def test_a_buffer_nobody_computes_is_reported_by_name():
    class Forgetful(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("table", torch.arange(4.0), persistent=False)

    model = build_on_meta(Forgetful)
    with pytest.raises(RuntimeError, match=r"buffers \['table'\].*init_buffers"):
        materialize(model, torch.device("cpu"), torch.float32)


def test_iter_weights_reads_every_dtype_and_views_stay_valid(tmp_path):
    tensors = {"w": torch.randn(300, 1000), "h": torch.randn(7, 3).bfloat16(), "i": torch.arange(5),
               "empty": torch.zeros(0, 4)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    kept = {}
    for name, t in loader.iter_weights(str(tmp_path), keep=lambda n: n != "h"):
        kept[name] = t  # kept past the next tensor: its released pages are read from the file again
    assert set(kept) == {"w", "i", "empty"}
    for name, t in kept.items():
        assert t.dtype == tensors[name].dtype and torch.equal(t, tensors[name])


def test_iter_weights_names_an_unsupported_dtype(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"x": torch.zeros(2, dtype=torch.complex64)}, str(path))
    with pytest.raises(ValueError, match="tensor 'x' has dtype C64"):
        list(loader.iter_weights(str(tmp_path)))
