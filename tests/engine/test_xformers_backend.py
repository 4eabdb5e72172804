"""The xformers backend on CPU, with the kernel call replaced by dense math (tests/engine/fake_fmha.py:
the installed xformers' masks, ops and input checks when importable, else a stand-in): the start-up
probe, the gather index, the engine's outputs against the torch backend in every scheduler situation,
and the per-step metadata built once per step, not once per layer."""
import contextlib

import pytest
import torch

from appliance.config.schema import EngineConfig
from appliance.engine import attention_select, model_runner
from appliance.engine.attention_geometry import AttentionGeometry
from appliance.engine.attention_probe import probe_backend, probe_steps
from appliance.engine.llm_engine import LLMEngine
from appliance.engine.xformers_attention import XformersAttentionBackend, key_rows
from tests.engine.fake_fmha import reference_fmha
from tests.engine.helpers import assert_no_block_leaks, build_checkpoint, check_logprobs_close, random_prompts
from tests.engine.test_llama_parity import GREEDY, LENGTHS

CPU = torch.device("cpu")
GEOMETRIES = [AttentionGeometry(4, 2, 64, 64), AttentionGeometry(4, 4, 16, 128), AttentionGeometry(8, 1, 32, 64)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=["gqa", "mha", "mqa"])
def test_probe_passes_every_step_kind(geometry, dtype):
    assert probe_backend(XformersAttentionBackend(reference_fmha()), geometry, CPU, dtype) is None


def test_probe_names_the_step_kind_a_kernel_refuses():
    why = probe_backend(XformersAttentionBackend(reference_fmha()), AttentionGeometry(4, 2, 80, 64), CPU,
                        torch.float16)
    assert why.startswith("decode step failed:") and "80" in why, why


def test_probe_catches_wrong_outputs():
    class Broken(XformersAttentionBackend):
        def forward(self, q, k, v, k_cache, v_cache, ctx, scale):
            out = super().forward(q, k, v, k_cache, v_cache, ctx, scale)
            return out if ctx.kind != "mixed" else out.flip(0)  # rows of the wrong sequences

    why = probe_backend(Broken(reference_fmha()), GEOMETRIES[0], CPU, torch.float16)
    assert why.startswith("mixed step: output differs from the torch backend's"), why


def test_probe_steps_are_one_of_each_kind():
    from appliance.engine.context import step_kind
    steps = probe_steps(64)
    assert {kind: step_kind(s.query_lens, s.context_lens) for kind, s in steps.items()} == \
        {"decode": "decode", "prefill": "prefill", "mixed": "mixed"}


def test_key_rows_walk_each_table():
    tables, lens, bs = [[7, 2], [4], [0, 5, 3]], [5, 3, 9], 4
    want = [t[p // bs] * bs + p % bs for t, n in zip(tables, lens) for p in range(n)]
    assert key_rows(tables, lens, bs, CPU).tolist() == want


SITUATIONS = {
    "plain": dict(num_kv_blocks=64),
    "chunked": dict(num_kv_blocks=64, max_num_batched_tokens=16),
    "prefix": dict(num_kv_blocks=64, enable_prefix_caching=True),
    "preempt": dict(num_kv_blocks=4, enable_prefix_caching=False),
}


def install_xformers_on_cpu(monkeypatch, around_kernel=contextlib.nullcontext):
    """The engine's plans name xformers and its runners get that backend over the dense reference (fp32
    allowed on CPU); returns the step kinds they prepared. `around_kernel` wraps each (reference) kernel
    call."""
    kinds = []
    fmha = reference_fmha(allow_fp32=True)
    kernel = fmha.memory_efficient_attention_forward

    def forward(*a, **k):
        with around_kernel():
            return kernel(*a, **k)

    fmha.memory_efficient_attention_forward = forward

    class Recording(XformersAttentionBackend):
        def prepare(self, step, ctx):
            kinds.append(ctx.kind)
            return super().prepare(step, ctx)

    monkeypatch.setattr(attention_select, "select_backend", lambda *a, **k: "xformers")
    monkeypatch.setattr(model_runner, "make_backend", lambda name: Recording(fmha))
    return kinds


def test_engine_on_xformers_matches_torch_backend(llama_dir, monkeypatch):
    prompts = random_prompts(400, LENGTHS)
    shared = random_prompts(400, [70], seed=5)[0]  # more than one 64-token block
    outs, kinds = {}, []
    for backend in ("torch", "xformers"):
        if backend == "xformers":
            kinds = install_xformers_on_cpu(monkeypatch)
        for situation, extra in SITUATIONS.items():
            batch = [shared + p for p in prompts[:6]] if situation == "prefix" else prompts
            engine = LLMEngine(llama_dir, EngineConfig(block_size=64, attention_backend="torch", **extra))
            if situation == "prefix":
                engine.generate(batch[:1], GREEDY)
            outs[backend, situation] = engine.generate(batch, GREEDY), engine.stats()
            assert_no_block_leaks(engine)
    assert set(kinds) == {"decode", "prefill", "mixed"}
    assert outs["xformers", "preempt"][1]["num_preemptions"] > 0
    assert outs["xformers", "prefix"][1]["prefix_cache_hit_tokens"] >= 64
    for situation in SITUATIONS:
        for i, (a, b) in enumerate(zip(outs["torch", situation][0], outs["xformers", situation][0])):
            check_logprobs_close(a.token_ids, a.logprobs, b.token_ids, b.logprobs, name=f"{situation} {i}")


@pytest.fixture(scope="module")
def four_layer_dir(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("llama4"), num_layers=4)


class HostCopies:
    """Counts tensors made from host data, except inside the reference kernel (dense test math that
    stands in for a GPU kernel)."""

    def __init__(self):
        self.count, self.paused = 0, False

    @contextlib.contextmanager
    def pause(self):
        self.paused = True
        try:
            yield
        finally:
            self.paused = False


def _copies_per_step(model_dir, monkeypatch, backend, copies):
    """Tensors made from host data (torch.tensor, as_tensor, Tensor.to(device)) per executed step: on
    a GPU each is a host -> device copy."""
    engine = LLMEngine(model_dir, EngineConfig(block_size=64, num_kv_blocks=16, max_num_batched_tokens=40,
                                               attention_backend=backend))
    runner = engine.executor.runner
    counts = []

    def counting(fn, moves_data=lambda a, k: True):
        def wrapper(*a, **k):
            copies.count += not copies.paused and moves_data(a, k)
            return fn(*a, **k)
        return wrapper

    def to_device(a, k):  # Tensor.to(dtype) converts in place on the device: not a copy from the host
        return "device" in k or any(isinstance(x, (torch.device, str)) for x in a[1:])

    real_execute = runner.execute

    def execute(step):
        copies.count = 0
        with monkeypatch.context() as m:
            m.setattr(torch, "tensor", counting(torch.tensor))
            m.setattr(torch, "as_tensor", counting(torch.as_tensor))
            m.setattr(torch.Tensor, "to", counting(torch.Tensor.to, to_device))
            logits = real_execute(step)
        counts.append((runner.attn_backend.name, copies.count))
        return logits

    runner.execute = execute
    engine.generate(random_prompts(400, [30, 70, 5]), GREEDY)  # prefill, mixed (chunked) and decode steps
    return counts


@pytest.mark.parametrize("backend", ["torch", "xformers"])
def test_step_metadata_is_built_once_per_step(llama_dir, four_layer_dir, monkeypatch, backend):
    copies = HostCopies()
    if backend == "xformers":
        install_xformers_on_cpu(monkeypatch, copies.pause)
    two, four = (_copies_per_step(d, monkeypatch, backend, copies) for d in (llama_dir, four_layer_dir))
    assert len(two) == len(four) > 3
    assert two == four  # the same copies with twice the layers: none is made per layer
    assert max(n for _, n in two) <= 8, two  # a handful per step, whatever the depth
