"""The packed int8 GEMM on AVX2 (csrc/gemm_int8_avx2.c: VPMADDUBSW on the VPDPBUSD GEMM's panels), which
CPUs without AVX512-VNNI run. It runs here whatever the CPU has (any CPU these kernels run on has AVX2):
the tests ask for it (`vnni=False`) or plan for a host without VNNI. It computes x quantised as the VNNI
GEMM does times the int8 weights, exactly but for fp32 rounding; the engine answers as on the VNNI GEMM."""
import pytest
import torch

from appliance.engine import cpu_kernels
from appliance.engine.config import EngineConfig
from appliance.engine.host import Host
from appliance.engine.int8 import Int8Plan, Int8Weight
from tests.conftest import REPO
from tests.engine.test_int8 import as_the_packed_gemm_sees

pytestmark = pytest.mark.skipif(not cpu_kernels.available(),
                                reason=f"CPU kernels unavailable: {cpu_kernels.unavailable_reason()}")

AVX2_HOST = Host(frozenset({"avx2", "fma"}), 16 << 30, 16 << 30)  # no VNNI, no bf16 units, whatever this CPU has
VNNI = "avx512_vnni" in Host.read().cpu_flags
# One-row decode (a tile of two panels), 2 (a panel a tile), 7 (4 + 3 rows on half panels), 8, 33 and 64
# (tiles and remainders), 200 and 611 (past a 192-row block of x: a prefill).
ROWS = [1, 2, 7, 8, 33, 64, 200, 611]
# Odd N (a part-filled panel; 1 and 37: a lone panel for one row, 70 and 129: a pair and a part-filled or
# lone last one) and K (a last quad with 1-3 k; past one 512-k pass: 1103 has three).
SHAPES = [(1, 1), (37, 7), (70, 601), (129, 1103), (64, 512)]


def packed_avx2(q: torch.Tensor, scale: torch.Tensor) -> cpu_kernels.PackedWeight:
    packed = cpu_kernels.PackedWeight(q, scale=scale, vnni=False)
    assert packed.data.dtype == torch.int8 and not packed.units and packed.input_dtypes == (torch.float32,)
    return packed


@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("n, k", SHAPES)
def test_the_avx2_int8_gemm_multiplies_the_quantised_x_exactly_but_for_fp32_rounding(m, n, k):
    """Against float64: x as the packed GEMMs quantise it (int8 per row and 512 k) times q · scale. The
    int32 sums of a pass are exact; each pass's sum times its x scale and the adding up across passes round
    in fp32, so each output lies within 1e-5 of the sum of its products' magnitudes (a product missing or
    counted twice is ~1/K of it: 1e-3 at these K)."""
    torch.manual_seed(m * 1000 + n + k)
    q = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    scale = torch.rand(n) * 0.01 + 1e-3
    x = torch.randn(m, k)
    y = cpu_kernels.linear(x, packed_avx2(q, scale))
    w = q.double() * scale.double()[:, None]
    xq = as_the_packed_gemm_sees(x)
    expected, bound = xq @ w.t(), 1e-5 * (xq.abs() @ w.abs().t())
    assert y.dtype == torch.float32 and y.shape == (m, n)
    assert ((y.double() - expected).abs() <= bound).all(), ((y.double() - expected).abs() - bound).max()


@pytest.mark.parametrize("m", [1, 2, 3, 5])  # the tiles: 1 row x 2 panels (and a lone one), 2 x 1, 3 and 4 x half
def test_the_largest_products_do_not_saturate(m):
    """VPMADDUBSW adds each pair of byte products into a saturating int16: the stored weights (q + 128, up
    to 255) against x at 127 would pass 32767; the kernel multiplies |x| by sign(q, x) (pairs at most
    2 x 127 x 127). Weights at -127/127 (every sign agreeing with x's in some rows, random in others), x
    at -127/127 (its own scale then 1, as the weights' here): y is the exact int64 product; the sums
    stay below 2^24, so fp32 holds them exactly too."""
    torch.manual_seed(m)
    n, k = 70, 1027  # three panels (a pair and a lone one for one row); two passes and a part quad
    x = torch.where(torch.rand(m, k) < 0.5, -127.0, 127.0)
    signs = torch.where(torch.rand(n, k) < 0.5, -1, 1)
    signs[0], signs[1] = torch.sign(x[0]).int(), -torch.sign(x[0]).int()  # each pair at +-2 x 127 x 127
    signs[40] = 1
    q = (127 * signs).to(torch.int8)
    y = cpu_kernels.linear(x, packed_avx2(q, torch.ones(n)))
    exact = x.long() @ q.long().t()
    assert exact[0, 0] == k * 127 * 127 and exact[0, 1] == -k * 127 * 127  # the worst case is in the table
    assert torch.equal(y.double(), exact.double())


@pytest.mark.skipif(not VNNI, reason="the VPDPBUSD GEMM needs AVX512-VNNI")
@pytest.mark.parametrize("m", [1, 7, 200])
def test_the_avx2_and_vnni_gemms_agree(m):
    """One packing, two kernels, the same int32 sums: the outputs differ only by fp32 rounding of the
    per-pass sums (where either contracts a multiply and an add)."""
    torch.manual_seed(m)
    q, scale, x = torch.randint(-127, 128, (129, 1103), dtype=torch.int8), torch.rand(129), torch.randn(m, 1103)
    vnni = cpu_kernels.linear(x, cpu_kernels.PackedWeight(q, scale=scale))
    avx2 = cpu_kernels.linear(x, packed_avx2(q, scale))
    assert (avx2 - vnni).abs().max() <= 1e-6 * vnni.abs().max()


def test_a_nan_in_x_reaches_its_rows_outputs_only():
    w8 = Int8Weight(torch.randn(40, 600) * 0.05, Int8Plan(0, torch.float32, packed=True))
    assert w8.packed is not None and not w8.packed.vnni
    x = torch.randn(3, 600)
    x[1, 550] = float("nan")  # the second pass's block
    y = w8.linear(x)
    assert torch.isnan(y[1]).all() and torch.isfinite(y[[0, 2]]).all()


LLAVA_TINY = REPO / "appliance" / "assets" / "models" / "llava_tiny"


@pytest.mark.skipif(not (LLAVA_TINY / "config.json").is_file(),
                    reason="appliance/assets/models/llava_tiny is not there (scripts/train_tiny_llava.py)")
def test_the_tiny_llava_answers_alike_on_the_avx2_int8_gemm(tmp_path):
    """The embedded demo model in int8, planned for a host without VNNI (so every int8 GEMM of its language
    model runs the AVX2 kernel, whatever this CPU has), against the same model on the VPDPBUSD GEMM where
    this CPU has it, else on torch's int8 path: the same greedy answers to its colour and shape questions on
    seeded images. Both run torch's attention."""
    from appliance.engine.linear import ColumnParallelLinear, RowParallelLinear
    from appliance.engine.llm_engine import LLMEngine
    from appliance.engine.sampling_params import SamplingParams
    from tests.chat.conftest import seeded_image_questions

    requests = seeded_image_questions(tmp_path)
    greedy = SamplingParams(temperature=0, max_tokens=12)
    answers = {}
    for name, host, ours in (("avx2", AVX2_HOST, True), ("reference", Host.read(), VNNI)):
        cfg = EngineConfig(num_kv_blocks=64, quantization="int8", cpu_kernels=ours, attention_backend="torch")
        engine = LLMEngine(str(LLAVA_TINY), cfg, host=host)
        layers = [m for m in engine.executor.runner.model.modules()
                  if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
        if name == "avx2":
            assert engine.kernels.int8.packed and not engine.kernels.int8.vnni
            assert layers and all(m.quantized.packed is not None and not m.quantized.packed.vnni for m in layers)
        ids = [engine.add_request(prompt, greedy, mm_data=items) for prompt, items in requests]
        final = {}
        while engine.has_unfinished():
            final.update((out.request_id, out.token_ids) for out in engine.step() if out.finished)
        answers[name] = [final[i] for i in ids]
    assert all(answers["reference"]) and answers["avx2"] == answers["reference"]
