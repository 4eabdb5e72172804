"""bf16 engines on CPU multiply on our GEMMs: on CPUs with AVX512-BF16 but no AMX every step, on weights
packed for VDPBF16PS; elsewhere their few-row (decode) steps, on torch's weight layout
(cpu_kernels.linear_bf16w), the rows following the CPU's units (which, per host: test_kernel_plan.py).
Answers stay those of torch's GEMM. The packed AVX2 GEMM (bf16 weights widened to fp32) runs here whatever
the CPU: its tests ask for it."""
import pytest
import torch
import torch.nn.functional as F

from appliance.engine import cpu_kernels, kernel_plan
from appliance.engine.host import Host
from appliance.engine.linear import PackableLinear, bf16_weight_linear, use_bf16_kernel

pytestmark = pytest.mark.skipif(not cpu_kernels.available(),
                                reason=f"CPU kernels unavailable: {cpu_kernels.unavailable_reason()}")

BF16_UNITS = "avx512_bf16" in Host.read().cpu_flags
# One-row decode, 2 and 7 rows (the 1-3 row tiles with their own odd-k sums, a 6-row tile and one more), 8
# and 33 (6-row tiles and remainders), 64, 200 and 611 (past a 96-row block of x: a prefill).
ROWS = [1, 2, 7, 8, 33, 64, 200, 611]
# Odd K (a last pair with one k) and N (a part-filled 32-output panel, a half of 16 left empty); K past one
# 256-k pass.
SHAPES = [(1, 1), (5, 7), (33, 77), (48, 256), (40, 513), (70, 1100)]


def assert_fp32_close(y, x, w):
    """y = x wᵀ as torch's GEMM computes it with w widened to fp32 (fp32 accumulation), up to summation
    order: each output within 1e-5 of the sum of its products' magnitudes (|x| |w|ᵀ). Two fp32 sums of K
    products in different orders differ by about sqrt(K) units of 2^-24 of that sum (at most K units);
    one product missing or counted twice is about 1/K of it (1e-3 at these K)."""
    expected = F.linear(x.float(), w.float())
    bound = 1e-5 * F.linear(x.float().abs(), w.float().abs())
    assert y.dtype == torch.float32 and y.shape == expected.shape
    assert ((y - expected).abs() <= bound).all(), ((y - expected).abs() - bound).max()


@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("n, k", SHAPES)
def test_the_avx2_packed_gemm_matches_torch_at_fp32_accumulation(m, n, k):
    torch.manual_seed(m * 1000 + n + k)
    x, w = torch.randn(m, k), torch.randn(n, k).to(torch.bfloat16)
    packed = cpu_kernels.PackedWeight(w, bf16_units=False)
    assert packed.data.dtype == torch.bfloat16 and packed.input_dtypes == (torch.bfloat16, torch.float32)
    assert_fp32_close(cpu_kernels.linear(x, packed), x, w)


@pytest.mark.parametrize("m", [1, 7, 200])
def test_the_avx2_packed_gemm_takes_bf16_rows_and_rounds_once(m):
    """A bf16 engine's activations: y is the fp32 product rounded to bf16 (one rounding: within half a bf16
    unit of torch's fp32 product, plus the summation order)."""
    x, w = torch.randn(m, 77).to(torch.bfloat16), torch.randn(40, 77).to(torch.bfloat16)
    y = cpu_kernels.linear(x, cpu_kernels.PackedWeight(w, bf16_units=False))
    expected = F.linear(x.float(), w.float())
    assert y.dtype == torch.bfloat16
    bound = expected.abs() * 2 ** -8 + 1e-5 * F.linear(x.float().abs(), w.float().abs())
    assert ((y.float() - expected).abs() <= bound).all()


def test_the_avx2_packed_gemm_takes_strided_rows_leading_dims_bias_and_no_rows():
    w, b = torch.randn(24, 31).to(torch.bfloat16), torch.randn(24)
    packed = cpu_kernels.PackedWeight(w, bf16_units=False)
    rows = torch.randn(10, 47)[:, 8:39]  # an odd row stride
    assert_fp32_close(cpu_kernels.linear(rows, packed), rows, w)
    x3 = torch.randn(2, 3, 31)
    assert_fp32_close(cpu_kernels.linear(x3, packed).flatten(0, 1), x3.flatten(0, 1), w)
    assert torch.equal(cpu_kernels.linear(x3, packed, b), cpu_kernels.linear(x3, packed) + b)
    assert cpu_kernels.linear(torch.randn(0, 31), packed).shape == (0, 24)
    with pytest.raises(ValueError, match="bfloat16 or float32 CPU input"):
        cpu_kernels.linear(torch.randn(2, 31, dtype=torch.float16), packed)


def test_the_avx2_packed_gemm_answers_alike_on_any_thread_count():
    """Threads split the output panels, each computed whole by one: the same bits on 1 and 2 threads."""
    x, w = torch.randn(33, 300), torch.randn(200, 300).to(torch.bfloat16)
    packed = cpu_kernels.PackedWeight(w, bf16_units=False)
    threads = torch.get_num_threads()
    try:
        answers = []
        for count in (1, 2):
            torch.set_num_threads(count)
            answers.append(cpu_kernels.linear(x, packed))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(*answers)


@pytest.mark.skipif(not BF16_UNITS, reason="the VDPBF16PS GEMM needs AVX512-BF16")
def test_one_packing_serves_both_bf16_gemms():
    x, w = torch.randn(9, 130).to(torch.bfloat16), torch.randn(45, 130).to(torch.bfloat16)
    units, fma = cpu_kernels.PackedWeight(w), cpu_kernels.PackedWeight(w, bf16_units=False)
    assert torch.equal(units.data, fma.data)
    close = (cpu_kernels.linear(x, units).float() - cpu_kernels.linear(x, fma).float()).abs()
    assert (close <= cpu_kernels.linear(x, fma).float().abs() * 2 ** -7 + 1e-3).all()


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
