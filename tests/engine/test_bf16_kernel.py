"""bf16 engines on CPU multiply on our GEMMs: on CPUs with AVX512-BF16 but no AMX every step, on weights
packed for VDPBF16PS (linear.packs_bf16); elsewhere their few-row (decode) steps, on torch's weight layout
(cpu_kernels.linear_bf16w), the rows following the CPU's units. Answers stay those of torch's GEMM."""
import pytest
import torch
import torch.nn.functional as F

from appliance.engine import cpu_kernels, linear
from appliance.engine.linear import PackableLinear, bf16_kernel_rows, bf16_weight_linear, packs_bf16, use_bf16_kernel

pytestmark = pytest.mark.skipif(not cpu_kernels.available(),
                                reason=f"CPU kernels unavailable: {cpu_kernels.unavailable_reason()}")


def test_it_matches_torch_in_bf16_with_bias_and_leading_dims():
    torch.manual_seed(0)
    w, b = torch.randn(48, 64).to(torch.bfloat16), torch.randn(48).to(torch.bfloat16)
    x = torch.randn(2, 3, 64).to(torch.bfloat16)
    y = bf16_weight_linear(x, w, b)
    assert y.dtype == torch.bfloat16 and y.shape == (2, 3, 48)
    exact = x.double() @ w.double().t() + b.double()
    # One bf16 rounding of the fp32 sum, then the bias added in bf16 (as F.linear's output is rounded).
    assert (y.double() - exact).abs().max() <= 0.02 * exact.abs().max()
    assert (F.linear(x, w, b).double() - exact).abs().max() <= 0.02 * exact.abs().max()


def test_weights_pack_on_avx512_bf16_without_amx():
    assert packs_bf16({"avx2", "avx512f", "avx512_bf16"})
    assert not packs_bf16({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})  # oneDNN's tiles
    assert not packs_bf16({"avx2", "fma"})


def test_the_rows_follow_the_cpu_units():
    assert bf16_kernel_rows(native_bf16=True) == linear.BF16_KERNEL_ROWS_NATIVE
    assert bf16_kernel_rows(native_bf16=False) == linear.BF16_KERNEL_ROWS_EMULATED
    assert 1 in linear.BF16_KERNEL_ROWS_NATIVE and 8 not in linear.BF16_KERNEL_ROWS_NATIVE  # torch's GEMM past a few
    assert 8 in linear.BF16_KERNEL_ROWS_EMULATED and 1 not in linear.BF16_KERNEL_ROWS_EMULATED


@pytest.mark.parametrize("rows, ours", [(0, False), (1, False), (2, True), (3, True), (4, False)])
def test_steps_up_to_the_rows_take_our_kernel(rows, ours, monkeypatch):
    calls = []
    monkeypatch.setattr(cpu_kernels, "linear_bf16w", lambda *a: calls.append(a) or cpu_kernels.ops().linear_bf16w(*a))
    layer = PackableLinear()
    layer.weight = torch.nn.Parameter(torch.randn(8, 16).to(torch.bfloat16))
    use_bf16_kernel(layer, range(2, 4))
    y = layer.matmul(torch.randn(rows, 16).to(torch.bfloat16))
    assert y.shape == (rows, 8) and len(calls) == int(ours)


def test_only_plain_bf16_weights_take_it():
    bf16, fp32 = PackableLinear(), PackableLinear()
    bf16.weight = torch.nn.Parameter(torch.randn(8, 16).to(torch.bfloat16))
    fp32.weight = torch.nn.Parameter(torch.randn(8, 16))
    model = torch.nn.ModuleList([bf16, fp32])
    use_bf16_kernel(model, range(1, 5))
    assert (bf16.bf16_kernel_rows, fp32.bf16_kernel_rows) == (range(1, 5), range(0))


def test_a_bf16_engine_decodes_on_it_and_answers_as_torch(llama_dir):
    """The same engine with engine.cpu_kernels off (torch's GEMM alone): the same first tokens and close
    logprobs (both accumulate in fp32 and round to bf16; a random model's later near-ties may fall either
    way)."""
    from appliance.engine.config import EngineConfig
    from appliance.engine.host import Host
    from appliance.engine.llm_engine import LLMEngine
    from appliance.engine.sampling_params import SamplingParams
    from tests.engine.helpers import random_prompts

    prompts = random_prompts(400, [5, 17, 30, 9], seed=33)
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0)
    answers = {}
    for ours in (False, True):
        engine = LLMEngine(llama_dir, EngineConfig(num_kv_blocks=64, dtype="bfloat16", cpu_kernels=ours))
        layers = [m for m in engine.executor.runner.model.modules() if isinstance(m, PackableLinear)]
        host = Host.read()
        packed = ours and packs_bf16(host.cpu_flags)
        assert layers and all((m.packed is not None) == packed for m in layers)
        expected = bf16_kernel_rows(host.native_bf16) if ours and not packed else range(0)
        assert all(m.bf16_kernel_rows == expected for m in layers)
        answers[ours] = engine.generate(prompts, greedy)
    for a, b in zip(answers[False], answers[True]):
        assert a.token_ids[0] == b.token_ids[0]
        assert abs(a.logprobs[0][a.token_ids[0]] - b.logprobs[0][b.token_ids[0]]) < 0.05
