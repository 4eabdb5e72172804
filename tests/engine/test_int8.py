"""int8 weight-only quantization: the per-channel rule, both multiply paths, and the kernel probe."""
import pytest
import torch

from appliance.engine import cpu_kernels, int8
from appliance.engine.host import Host
from appliance.engine.int8 import Int8Plan, Int8Weight, kernel_problem
from appliance.engine.kernel_plan import INT8_WEIGHT_ROWS

# What each host's kernel plan gives (test_kernel_plan.py): torch's kernel and tiles; our few-row GEMM
# too (AMX hosts); our packed GEMM for every step (on VPDPBUSD here; the AVX2 one: test_int8_avx2_kernel.py).
AMX, AVX2 = Int8Plan(16, torch.bfloat16), Int8Plan(192, torch.float32)
OURS = Int8Plan(192, torch.float32, cpu_kernel_rows=INT8_WEIGHT_ROWS)
PACKED = Int8Plan(0, torch.bfloat16, packed=True, vnni=True)


def test_rows_are_scaled_symmetrically_per_output_channel():
    weight = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0], [-0.25, 0.25, 0.125]])
    w8 = Int8Weight(weight, AMX)
    assert w8.q.dtype == torch.int8 and w8.q.abs().amax(dim=1).tolist() == [127, 0, 127]
    assert torch.allclose(w8.scale, torch.tensor([2.0 / 127, w8.scale[1].item(), 0.25 / 127]))
    assert torch.allclose(w8.dequantized(), weight, atol=2.0 / 254 + 1e-6)
    assert w8.nbytes == 9 + 3 * 4


def test_quantising_in_chunks_matches_at_once(monkeypatch):
    weight = torch.randn(50, 16)
    whole = Int8Weight(weight, AMX)
    monkeypatch.setattr(int8, "QUANT_CHUNK_ROWS", 7)
    chunked = Int8Weight(weight, AMX)
    assert torch.equal(whole.q, chunked.q) and torch.equal(whole.scale, chunked.scale)


PATHS = [(plan, rows) for plan in (AMX, AVX2) for rows in (1, plan.kernel_rows, plan.kernel_rows + 1, 200)]


@pytest.mark.parametrize("plan,rows", PATHS, ids=[f"{p.tile_dtype}-{r}" for p, r in PATHS])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_matches_the_dequantised_weight(plan, rows, dtype, monkeypatch):
    monkeypatch.setattr(int8, "TILE_ROWS", 24)  # several tiles, the last one partial
    torch.manual_seed(0)
    weight, bias = torch.randn(70, 64) * 0.05, torch.randn(70)
    w8 = Int8Weight(weight, plan)
    x = torch.randn(2, rows, 64).to(dtype)
    y = w8.linear(x, bias.to(dtype))
    expected = x.float() @ w8.dequantized().t() + bias
    assert y.dtype == dtype and y.shape == (2, rows, 70)
    assert torch.allclose(y.float(), expected, rtol=0.02, atol=0.02)  # bf16 activations or tiles
    assert torch.allclose(y.float(), x.float() @ weight.t() + bias, rtol=0.05, atol=0.05)


@pytest.mark.parametrize("k", [8, 24, 40, 100])
@pytest.mark.parametrize("rows", [1, 4, 33])
def test_rows_torchs_kernel_cannot_take_run_on_tiles(k, rows, monkeypatch):
    """torch's int8 kernel crashes or sums wrongly on AVX-512 CPUs when K % 16 != 0: never called there."""
    calls = []
    monkeypatch.setattr(torch.ops.aten, "_weight_int8pack_mm", lambda *a: calls.append(a))
    torch.manual_seed(k + rows)
    w8 = Int8Weight(torch.randn(37, k), AVX2)
    x = torch.randn(rows, k)
    assert torch.allclose(w8.linear(x), x @ w8.dequantized().t(), rtol=1e-5, atol=1e-5) and not calls


def test_the_plan_follows_the_cpu_units():
    assert AMX.tile_dtype == torch.bfloat16 and AVX2.tile_dtype == torch.float32  # bf16 emulated without units
    assert AVX2.kernel_rows > AMX.kernel_rows


def test_fp32_tiles_past_the_kernel_are_exact_to_fp32(monkeypatch):
    """Without bf16 units the tiles are fp32: a batch matches the dequantised weight to fp32 rounding."""
    torch.manual_seed(1)
    weight = torch.randn(40, 32)
    w8 = Int8Weight(weight, AVX2)
    x = torch.randn(AVX2.kernel_rows + 5, 32)
    assert torch.allclose(w8.linear(x), x @ w8.dequantized().t(), rtol=1e-5, atol=1e-5)


needs_our_kernels = pytest.mark.skipif(not cpu_kernels.available(),
                                       reason=f"CPU kernels unavailable: {cpu_kernels.unavailable_reason()}")


@needs_our_kernels
@pytest.mark.parametrize("rows", [1, 3, INT8_WEIGHT_ROWS, INT8_WEIGHT_ROWS + 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_small_steps_run_on_our_kernel_in_fp32(rows, dtype, monkeypatch):
    calls = []
    monkeypatch.setattr(cpu_kernels, "linear_int8", lambda *a: calls.append(a) or cpu_kernels.ops().linear_int8(*a))
    torch.manual_seed(2)
    weight, bias = torch.randn(37, 48) * 0.05, torch.randn(37)  # torch's kernel needs K % 16 == 0
    w8 = Int8Weight(weight, OURS)
    x = torch.randn(rows, 48).to(dtype)
    y = w8.linear(x, bias.to(dtype))
    assert y.dtype == dtype and len(calls) == (rows <= INT8_WEIGHT_ROWS)
    if calls and dtype == torch.float32:  # fp32 activations: exact to fp32 rounding, unlike torch's bf16 kernel
        assert torch.allclose(y, x @ w8.dequantized().t() + bias, rtol=1e-5, atol=1e-5)
    assert torch.allclose(y.float(), x.float() @ w8.dequantized().t() + bias.to(dtype).float(), rtol=0.02, atol=0.02)


VNNI = "avx512_vnni" in Host.read().cpu_flags
needs_vnni = pytest.mark.skipif(not VNNI, reason="the packed int8 GEMM needs AVX512-VNNI")


X_BLOCK = 512  # k per block of x sharing one scale in the packed int8 GEMM


def as_the_packed_gemm_sees(x: torch.Tensor) -> torch.Tensor:
    """x quantised as the packed int8 GEMM does, in float64: int8 per row and per 512 k, each block scaled
    to its largest |x| (the scale and the rounding in float32, as the kernel computes them)."""
    out = torch.empty(x.shape, dtype=torch.float64)
    for k0 in range(0, x.shape[1], X_BLOCK):
        block = x[:, k0:k0 + X_BLOCK]
        largest = block.abs().amax(dim=1, keepdim=True)
        # 127 / largest divided in float32 (a Python number over a tensor is its reciprocal times 127 in
        # torch: a rounding apart, which moves an x at a half step to the other int8 level)
        inv = torch.where(largest > 0, torch.full_like(largest, 127.0) / largest, torch.zeros_like(largest))
        q = torch.round(block * inv).clamp(-127, 127)
        out[:, k0:k0 + X_BLOCK] = q.double() * (largest / 127).double()
    return out


@needs_our_kernels
@needs_vnni
@pytest.mark.parametrize("rows", [1, 2, 8, 9, 200])  # the 1-2 row paths, a full tile, past a 192-row block
@pytest.mark.parametrize("n, k", [(37, 48), (70, 601), (33, 1103)])  # a partial panel; K's last quad partial; 3 passes
def test_packed_weights_multiply_as_the_quantised_rows(rows, n, k):
    """The packed GEMM computes exactly (but for fp32 rounding) x quantised to int8 per row and block times
    the int8 weights; that is within a few thousandths of the largest output of x times them."""
    torch.manual_seed(rows + n + k)
    weight, bias = torch.randn(n, k) * 0.05, torch.randn(n)
    w8, rowwise = Int8Weight(weight, PACKED), Int8Weight(weight, AVX2)
    assert w8.q is None and w8.packed.data.dtype == torch.int8
    assert w8.nbytes == w8.packed.data.numel() + 4 * n
    x = torch.randn(rows, k)
    for dtype in (torch.float32, torch.bfloat16):
        y = w8.linear(x.to(dtype), bias.to(dtype))
        assert y.dtype == dtype and y.shape == (rows, n)
    y = w8.linear(x, bias).double()
    w = rowwise.dequantized().double()
    exact = as_the_packed_gemm_sees(x) @ w.t() + bias.double()
    assert (y - exact).abs().max() <= 1e-5 * exact.abs().max()
    unquantised_x = x.double() @ w.t() + bias.double()
    assert (y - unquantised_x).abs().max() <= 1e-2 * unquantised_x.abs().max()


@needs_our_kernels
@needs_vnni
def test_the_largest_sums_of_a_pass_do_not_overflow():
    """Every x at its block's largest value against weights of 127: a pass sums 512 products of 255 x 127
    (the weights stored with their offset of 128), below 2^24: exact in int32 and in fp32."""
    k = 3 * 512
    weight = torch.full((40, k), 0.5)
    w8 = Int8Weight(weight, PACKED)
    x = torch.full((3, k), -2.0)
    assert torch.allclose(w8.linear(x), torch.full((3, 40), -1.0 * k), rtol=1e-6)


@needs_our_kernels
@needs_vnni
def test_a_nan_in_x_reaches_its_rows_outputs_only():
    """A NaN makes its block's scale NaN: that row's outputs are NaN, not finite garbage; other rows hold."""
    w8 = Int8Weight(torch.randn(40, 600) * 0.05, PACKED)
    x = torch.randn(3, 600)
    x[1, 550] = float("nan")  # the second pass's block
    y = w8.linear(x)
    assert torch.isnan(y[1]).all() and torch.isfinite(y[[0, 2]]).all()
    assert torch.allclose(y[[0, 2]], w8.linear(x[[0, 2]]), rtol=1e-6, atol=1e-6)


def test_the_cpu_has_a_kernel_and_a_missing_one_is_named():
    assert kernel_problem(torch.device("cpu")) is None

    def missing(*args):
        raise NotImplementedError("Could not run 'aten::_weight_int8pack_mm' with arguments from the 'CUDA' backend")

    problem = kernel_problem(torch.device("cpu"), kernel=missing)
    assert problem.startswith("torch has no int8 weight kernel on cpu") and "_weight_int8pack_mm" in problem


def test_an_int8_engine_quantises_the_decoder_and_keeps_greedy_answers(llama_dir):
    from appliance.engine.config import EngineConfig
    from appliance.engine.linear import ColumnParallelLinear, RowParallelLinear
    from appliance.engine.llm_engine import LLMEngine
    from appliance.engine.sampling_params import SamplingParams
    from tests.engine.helpers import random_prompts

    prompts = random_prompts(400, [5, 17, 30, 9], seed=31)
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0)
    full = LLMEngine(llama_dir, EngineConfig(num_kv_blocks=64)).generate(prompts, greedy)
    engine = LLMEngine(llama_dir, EngineConfig(num_kv_blocks=64, quantization="int8"))
    layers = [m for m in engine.executor.runner.model.modules()
              if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
    assert layers and all(m.quantized is not None and m.weight.numel() == 0 for m in layers)
    quantized = engine.generate(prompts, greedy)
    first_tokens = [a.token_ids[0] == b.token_ids[0] for a, b in zip(full, quantized)]
    assert sum(first_tokens) >= 3
    drift = max(abs(a.logprobs[0][a.token_ids[0]] - b.logprobs[0][b.token_ids[0]])
                for a, b in zip(full, quantized) if a.token_ids[0] == b.token_ids[0])
    assert drift < 0.1


def test_int8_is_refused_for_a_pool_engine():
    from appliance.config.compose import compose
    from appliance.errors import ConfigError

    with pytest.raises(ConfigError, match="engine.quantization=int8 applies to a language model"):
        compose(["pipeline=prithvi_flood", "engine.quantization=int8"])


@needs_our_kernels
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_our_int8_kernel_keeps_the_engines_greedy_tokens(llama_dir, dtype):
    """int8 on our kernels (engine.cpu_kernels, the default: the packed GEMM on CPUs without AMX, on
    VPDPBUSD with AVX512-VNNI; else the few-row one) answers as int8 on torch's alone: the same first
    tokens (our kernels quantise activations per 512 k or keep them in fp32 where torch's rounds them to
    bf16, so a random model's near-ties later may fall either way, in either engine dtype)."""
    from appliance.engine.config import EngineConfig
    from appliance.engine.linear import ColumnParallelLinear
    from appliance.engine.llm_engine import LLMEngine
    from appliance.engine.sampling_params import SamplingParams
    from tests.engine.helpers import random_prompts

    prompts = random_prompts(400, [5, 17, 30, 9], seed=32)
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    answers = {}
    for ours in (False, True):
        engine = LLMEngine(llama_dir, EngineConfig(num_kv_blocks=64, quantization="int8", dtype=dtype,
                                                   cpu_kernels=ours))
        layer = next(m for m in engine.executor.runner.model.modules() if isinstance(m, ColumnParallelLinear))
        flags = Host.read().cpu_flags
        packed = ours and "amx_bf16" not in flags
        assert layer.quantized.plan == engine.kernels.int8
        assert layer.quantized.plan.packed == packed and (layer.quantized.packed is not None) == packed
        assert not packed or layer.quantized.packed.vnni == ("avx512_vnni" in flags)
        assert layer.quantized.plan.cpu_kernel_rows == (INT8_WEIGHT_ROWS if ours and not packed else 0)
        answers[ours] = [a.token_ids for a in engine.generate(prompts, greedy)]
    assert [a[0] for a in answers[True]] == [a[0] for a in answers[False]]
