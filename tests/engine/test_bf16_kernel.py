"""bf16 engines on CPU multiply on our GEMMs: on CPUs with AVX512-BF16 but no AMX every step, on weights
packed for VDPBF16PS; elsewhere their few-row (decode) steps, on torch's weight layout
(cpu_kernels.linear_bf16w), the rows following the CPU's units (which, per host: test_kernel_plan.py).
Answers stay those of torch's GEMM."""
import pytest
import torch
import torch.nn.functional as F

from appliance.engine import cpu_kernels, kernel_plan
from appliance.engine.linear import PackableLinear, bf16_weight_linear, use_bf16_kernel

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


def test_the_rows_follow_the_cpu_units():
    native, emulated = kernel_plan.BF16_WEIGHT_ROWS_NATIVE, kernel_plan.BF16_WEIGHT_ROWS_EMULATED
    assert 1 in native and 8 not in native  # torch's GEMM past a few
    assert 8 in emulated and 1 not in emulated


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
        flags = Host.read().cpu_flags
        packed = ours and "avx512_bf16" in flags and "amx_bf16" not in flags
        assert engine.kernels.packed_gemm == packed
        assert layers and all((m.packed is not None) == packed for m in layers)
        rows = kernel_plan.BF16_WEIGHT_ROWS_NATIVE if "amx_bf16" in flags else kernel_plan.BF16_WEIGHT_ROWS_EMULATED
        expected = rows if ours and not packed else range(0)
        assert engine.kernels.bf16_weight_rows == expected and all(m.bf16_kernel_rows == expected for m in layers)
        answers[ours] = engine.generate(prompts, greedy)
    for a, b in zip(answers[False], answers[True]):
        assert a.token_ids[0] == b.token_ids[0]
        assert abs(a.logprobs[0][a.token_ids[0]] - b.logprobs[0][b.token_ids[0]]) < 0.05
