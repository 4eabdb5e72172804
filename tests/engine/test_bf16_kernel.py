"""bf16 engines on CPU multiply on our GEMMs: on CPUs without AMX every step, on weights packed once, on
VDPBF16PS where the CPU has AVX512-BF16 and widened to fp32 on AVX2/FMA where it has no bf16 units; on AMX
hosts their few-row (decode) steps, on torch's weight layout (cpu_kernels.linear_bf16w). Which, per host:
test_kernel_plan.py. The AVX2 GEMM runs here whatever the CPU (any CPU these kernels run on has AVX2/FMA):
its tests ask for it (`bf16_units=False`) or plan for a host without bf16 units. Answers stay those of
torch's GEMM."""
import pytest
import torch
import torch.nn.functional as F

from appliance.engine import cpu_kernels, kernel_plan
from appliance.engine.config import EngineConfig
from appliance.engine.host import Host
from appliance.engine.linear import PackableLinear, bf16_weight_linear, use_bf16_kernel
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(not cpu_kernels.available(),
                                reason=f"CPU kernels unavailable: {cpu_kernels.unavailable_reason()}")

AVX2_HOST = Host(frozenset({"avx2", "fma"}), 16 << 30, 16 << 30)  # no bf16 units, whatever this CPU has
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


def test_the_few_row_kernel_runs_on_amx_hosts_only():
    rows = kernel_plan.BF16_WEIGHT_ROWS_NATIVE
    assert 1 in rows and 8 not in rows  # torch's GEMM (oneDNN on AMX) past a few
    avx2_plan = kernel_plan.choose_kernels(EngineConfig(dtype="bfloat16"), AVX2_HOST, None, "cpu")
    assert avx2_plan.bf16_weight_rows == range(0)


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


def packable_layers(engine):
    return [m for m in engine.executor.runner.model.modules() if isinstance(m, PackableLinear)]


def test_a_bf16_engine_runs_its_hosts_kernel_and_answers_as_torch(llama_dir):
    """This CPU's own plan, against the same engine with engine.cpu_kernels off (torch's GEMM alone): the same
    first tokens and close logprobs (both accumulate in fp32 and round to bf16; a random model's later
    near-ties may fall either way)."""
    from appliance.engine.llm_engine import LLMEngine
    from appliance.engine.sampling_params import SamplingParams
    from tests.engine.helpers import random_prompts

    prompts = random_prompts(400, [5, 17, 30, 9], seed=33)
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0)
    answers = {}
    flags = Host.read().cpu_flags
    for ours in (False, True):
        engine = LLMEngine(llama_dir, EngineConfig(num_kv_blocks=64, dtype="bfloat16", cpu_kernels=ours))
        layers = packable_layers(engine)
        packed = ours and "amx_bf16" not in flags
        assert engine.kernels.packed_gemm == packed and engine.kernels.bf16_units == ("avx512_bf16" in flags)
        assert layers and all((m.packed is not None) == packed for m in layers)
        assert all(m.packed.bf16_units == ("avx512_bf16" in flags) for m in layers if m.packed is not None)
        expected = kernel_plan.BF16_WEIGHT_ROWS_NATIVE if ours and not packed else range(0)
        assert engine.kernels.bf16_weight_rows == expected and all(m.bf16_kernel_rows == expected for m in layers)
        answers[ours] = engine.generate(prompts, greedy)
    for a, b in zip(answers[False], answers[True]):
        assert a.token_ids[0] == b.token_ids[0]
        assert abs(a.logprobs[0][a.token_ids[0]] - b.logprobs[0][b.token_ids[0]]) < 0.05


LLAVA_TINY = REPO / "appliance" / "assets" / "models" / "llava_tiny"


@pytest.mark.skipif(not (LLAVA_TINY / "config.json").is_file(),
                    reason="appliance/assets/models/llava_tiny is not there (scripts/train_tiny_llava.py)")
def test_the_tiny_llava_answers_alike_on_the_avx2_gemm_and_on_torchs(tmp_path):
    """The embedded demo model in bf16, planned for a host without bf16 units (so every GEMM of its
    language model runs the AVX2 packed kernel, whatever this CPU has), against the same engine on torch's
    GEMM: the same greedy answers to its colour and shape questions on seeded images. Both run torch's
    attention, so the GEMM is the only difference."""
    from appliance.engine.llm_engine import LLMEngine
    from appliance.engine.sampling_params import SamplingParams
    from tests.chat.conftest import seeded_image_questions

    requests = seeded_image_questions(tmp_path)
    greedy = SamplingParams(temperature=0, max_tokens=12)
    answers = {}
    for ours in (False, True):
        cfg = EngineConfig(num_kv_blocks=64, dtype="bfloat16", cpu_kernels=ours, attention_backend="torch")
        engine = LLMEngine(str(LLAVA_TINY), cfg, host=AVX2_HOST)
        if ours:
            assert engine.kernels.packed_gemm and not engine.kernels.bf16_units
            layers = packable_layers(engine)
            assert layers and all(m.packed is not None and not m.packed.bf16_units for m in layers)
        ids = [engine.add_request(prompt, greedy, mm_data=items) for prompt, items in requests]
        final = {}
        while engine.has_unfinished():
            final.update((out.request_id, out.token_ids) for out in engine.step() if out.finished)
        answers[ours] = [final[i] for i in ids]
    assert all(answers[False]) and answers[True] == answers[False]
