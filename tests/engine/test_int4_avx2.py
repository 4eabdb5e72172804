"""Our int4 GEMV and GEMM on AVX2 alone: torch's AVX2 packing read in place or unpacked (built here from q,
so that the kernels are tested on any host, and checked against torch's own AVX2 packing in a subprocess),
the dequantised product within x's int8 rounding, the VNNI GEMV's bits and each other's, the plan that
picks them, and an engine on them."""
import os
import subprocess
import sys

import pytest
import torch

from appliance.engine import cpu_kernels, int4
from appliance.engine.host import Host
from appliance.engine.int4 import quantize_groups
from appliance.engine.kernel_plan import INT4_GEMV_ROWS_AVX2, INT4_KERNEL_ROWS, \
    INT4_KERNEL_ROWS_TORCH_TILES, int4_plan
from tests.engine.test_int4 import formula, int8_x_bound

AVX2_LAYOUT = int4.Int4Layout(32, ((16, tuple(range(16))), (32, tuple(i // 2 + 16 * (i % 2) for i in range(32)))))
PLAIN_LAYOUT = int4.Int4Layout(32, ((16, tuple(range(16))), (32, tuple(range(32)))))  # torch's default build
AVX2 = frozenset({"avx2", "fma"})
VNNI = frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"})
AVX512_OFF = ["avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_bf16"]


def pack_avx2(q: torch.Tensor, tail_halves: bool) -> torch.Tensor:
    """q int [N, K] (N a multiple of 16) in torch's AVX2 int4 layout: 32-row blocks, k-major, byte j of a k
    holding rows j (low nibble) and j + 16 (high); a 16-row last block's bytes rows j and j + 8 where
    `tail_halves`, else 2j and 2j + 1 (what torch writes)."""
    n, k = q.shape
    full = n // 32 * 32
    blocks = q[:full].reshape(-1, 32, k).transpose(1, 2)  # [blocks, K, 32]
    parts = [(blocks[..., :16] | blocks[..., 16:] << 4).flatten()]
    if n > full:
        t = q[full:].t()  # [K, 16]
        parts.append((t[:, :8] | t[:, 8:] << 4 if tail_halves else t[:, 0::2] | t[:, 1::2] << 4).flatten())
    return torch.cat(parts).to(torch.uint8).reshape(n, k // 2)


def test_the_avx2_layout_here_is_what_the_plan_reads():
    assert AVX2_LAYOUT.avx2_fast and not AVX2_LAYOUT.panels_fast and not AVX2_LAYOUT.halves(16)
    assert not PLAIN_LAYOUT.avx2_fast


@pytest.mark.parametrize("flags, off, layout, gemv", [
    (AVX2, [], AVX2_LAYOUT, INT4_GEMV_ROWS_AVX2),
    (VNNI, AVX512_OFF, AVX2_LAYOUT, INT4_GEMV_ROWS_AVX2),  # AVX-512 hidden, torch held to AVX2
    (VNNI, [], AVX2_LAYOUT, INT4_GEMV_ROWS_AVX2),  # the VNNI GEMV reads only the 64-row layout
    (frozenset({"avx2"}), [], AVX2_LAYOUT, 0),  # no FMA: our kernels' floor
    (AVX2, [], PLAIN_LAYOUT, 0),  # rows 2j and 2j + 1 in a byte: not read in place
], ids=["avx2", "vnni-hidden", "vnni-avx2-packing", "no-fma", "plain-packing"])
@pytest.mark.parametrize("ours", [True, False])
def test_the_avx2_gemv_and_gemm_take_every_row_where_torch_packs_for_avx2(flags, off, layout, gemv, ours,
                                                                          monkeypatch):
    monkeypatch.setattr("appliance.engine.kernel_plan.learn_layout", lambda: layout)
    plan = int4_plan(Host(flags, 16 << 30, 16 << 30).without(off), 128, ours)
    if ours and gemv:  # torch's int4 kernel and the tiles run nowhere
        assert (plan.gemv_rows, plan.kernel_rows, plan.vnni, plan.gemm) == (gemv, 0, False, True)
        return
    kernel_rows = INT4_KERNEL_ROWS if ours else INT4_KERNEL_ROWS_TORCH_TILES
    assert (plan.gemv_rows, plan.kernel_rows, plan.vnni, plan.gemm) == (0, kernel_rows, False, False)


def test_the_plan_line_names_the_avx2_gemv_and_gemm(monkeypatch):
    from appliance.engine.config import EngineConfig
    from appliance.engine.kernel_plan import choose_kernels

    monkeypatch.setattr("appliance.engine.kernel_plan.learn_layout", lambda: AVX2_LAYOUT)
    plan = choose_kernels(EngineConfig(dtype="float32", quantization="int4", quantization_group_size=64),
                          Host(AVX2, 16 << 30, 16 << 30), None, "cpu")
    assert (f"gemm int4 (groups of 64) rows 1-{INT4_GEMV_ROWS_AVX2}=ours int4 gemv (avx2), "
            f"rows {INT4_GEMV_ROWS_AVX2 + 1}+=ours int4 gemm (avx2);") in plan.describe()


needs_our_kernels = pytest.mark.skipif(not cpu_kernels.available(),
                                       reason=f"CPU kernels unavailable: {cpu_kernels.unavailable_reason()}")
HAS_VNNI = {"avx512_vnni", "avx512bw"} <= Host.read().cpu_flags


@needs_our_kernels
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("n", [1104, 64])  # 34 full 32-row blocks and a 16-row last one; 2 full ones
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_our_avx2_gemv_is_the_dequantised_product_within_x_int8_rounding(group_size, rows, n, dtype):
    """K = 640 (5 to 20 groups); each row's zeros far from 0 and x's mean not 0, so that the zero term
    counts; bf16 or fp32 scales and zeros; a short last block in either nibble order. Where this CPU has
    AVX512-VNNI, the same bits as the VNNI GEMV on torch's AVX-512 packing of the same q (x quantised and
    groups scaled alike)."""
    torch.manual_seed(rows + group_size + n)
    k = 640
    weight = torch.randn(n, k) * 0.05 + torch.linspace(-0.2, 0.2, n)[:, None]
    q, scale, zero = quantize_groups(weight, group_size, dtype)
    scales_and_zeros = torch.stack((scale, zero), dim=-1).transpose(0, 1).to(dtype).contiguous()
    x = (torch.randn(rows, k) + 0.5).to(dtype).float()
    w = formula(q, scale, zero).float()
    bound = int8_x_bound(x, w, group_size) + 1e-5 * (x.abs() @ w.abs().t())
    for tail_halves in (False, True):
        y = cpu_kernels.gemv_int4_avx2(x, pack_avx2(q, tail_halves), scales_and_zeros, tail_halves, group_size)
        error = (y - x @ w.t()).abs()
        assert (error <= bound).all(), f"{(error - bound).max()} past the bound"
        assert error.max() > 0  # x was rounded to int8
    if HAS_VNNI and int4.learn_layout().panels_fast:
        tail = n % 64
        vnni = cpu_kernels.gemv_int4(x, int4.pack(q), scales_and_zeros, tail > 0 and int4.learn_layout().halves(tail),
                                     group_size)
        assert torch.equal(y, vnni)


@needs_our_kernels
def test_our_avx2_gemv_reads_strided_rows_and_refuses_what_it_cannot_read():
    q = torch.randint(0, 16, (48, 128), dtype=torch.int32)
    scales_and_zeros = torch.tensor([1.0, 8.0]).expand(4, 48, 2).contiguous()  # w = q
    x = torch.randn(3, 256)[:, :128]
    y = cpu_kernels.gemv_int4_avx2(x, pack_avx2(q, False), scales_and_zeros, False, 32)
    assert (y - x @ q.float().t()).abs().max() <= int8_x_bound(x, q.float(), 32).max()
    with pytest.raises(ValueError, match="the int4 GEMV reads torch's AVX2 packing, whose rows come in 16s, got 24"):
        cpu_kernels.gemv_int4_avx2(torch.ones(2, 128), torch.zeros(24, 64, dtype=torch.uint8),
                                   torch.ones(4, 24, 2), True, 32)
    with pytest.raises(ValueError, match="group_size must be a multiple of 4 up to 128 that divides K = 128, got 48"):
        cpu_kernels.gemv_int4_avx2(x, pack_avx2(q, False), scales_and_zeros, False, 48)


@needs_our_kernels
@pytest.mark.parametrize("group_size, k", [(32, 640), (128, 640), (36, 720)])  # 640: a 512-k pass and a short one
@pytest.mark.parametrize("rows", [1, 5, 34, 200])  # whole 3-row tiles or not; past the 192-row block
@pytest.mark.parametrize("n", [1104, 64])  # 34 full 32-row blocks and a 16-row last one; 2 full ones
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_our_avx2_gemm_gives_the_avx2_gemvs_bits(group_size, k, rows, n, dtype):
    """The GEMM unpacks the blocks the GEMV reads in place and sums each group's int16 pairs (9 quads a
    group of 36: a chunk of 8 and one of 1) into the same int32 sums, scaled alike: the same bits, so the
    GEMV test's bound holds for it too (checked here once more at prefill sizes)."""
    torch.manual_seed(rows + group_size + n)
    weight = torch.randn(n, k) * 0.05 + torch.linspace(-0.2, 0.2, n)[:, None]
    q, scale, zero = quantize_groups(weight, group_size, dtype)
    scales_and_zeros = torch.stack((scale, zero), dim=-1).transpose(0, 1).to(dtype).contiguous()
    x = (torch.randn(rows, 2 * k) + 0.5).to(dtype).float()[:, :k]  # rows 2k apart
    for tail_halves in (False, True):
        packed = pack_avx2(q, tail_halves)
        y = cpu_kernels.linear_int4_avx2(x, packed, scales_and_zeros, tail_halves, group_size)
        assert torch.equal(y, cpu_kernels.gemv_int4_avx2(x, packed, scales_and_zeros, tail_halves, group_size))
    w = formula(q, scale, zero).float()
    error = (y - x @ w.t()).abs()
    bound = int8_x_bound(x, w, group_size) + 1e-5 * (x.abs() @ w.abs().t())
    assert (error <= bound).all(), f"{(error - bound).max()} past the bound"


@needs_our_kernels
def test_our_avx2_gemm_refuses_rows_torchs_avx2_packing_cannot_hold():
    with pytest.raises(ValueError, match="the int4 GEMM reads torch's AVX2 packing, whose rows come in 16s, got 24"):
        cpu_kernels.linear_int4_avx2(torch.ones(40, 128), torch.zeros(24, 64, dtype=torch.uint8),
                                     torch.ones(4, 24, 2), True, 32)


ENGINE_ON_AVX2 = """
import torch
from appliance.engine import cpu_kernels, int4, kernel_plan
from appliance.engine.config import EngineConfig
from appliance.engine.llm_engine import LLMEngine
from appliance.engine.sampling_params import SamplingParams
from tests.engine.helpers import random_prompts
from tests.engine.test_int4_avx2 import AVX512_OFF, pack_avx2
from tests.servers import LLAVA_TINY

q = torch.randint(0, 16, (80, 64), dtype=torch.int32)
assert torch.equal(int4.pack(q), pack_avx2(q, int4.learn_layout().halves(16)))  # torch's own AVX2 packing
calls = {"gemv": [], "gemm": []}
gemv, gemm = cpu_kernels.gemv_int4_avx2, cpu_kernels.linear_int4_avx2
cpu_kernels.gemv_int4_avx2 = lambda x, *a: calls["gemv"].append(x.shape[0]) or gemv(x, *a)
cpu_kernels.linear_int4_avx2 = lambda x, *a: calls["gemm"].append(x.shape[0]) or gemm(x, *a)
prompts = random_prompts(399, [5, 17, 30], seed=41)
greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
cfg = EngineConfig(num_kv_blocks=32, dtype="float32", quantization="int4", quantization_group_size=32,
                   cpu_features_off=AVX512_OFF)
engine = LLMEngine(str(LLAVA_TINY), cfg)
print(engine.kernels.describe())
ours = [a.token_ids for a in engine.generate(prompts, greedy)]
few = kernel_plan.INT4_GEMV_ROWS_AVX2
assert calls["gemv"] and max(calls["gemv"]) <= few < min(calls["gemm"]), calls
torch_cfg = EngineConfig(num_kv_blocks=32, dtype="float32", quantization="int4", quantization_group_size=32,
                         cpu_kernels=False)  # torch's int4 kernel and its dequantised tiles
calls = {"gemv": [], "gemm": []}
torchs = [a.token_ids for a in LLMEngine(str(LLAVA_TINY), torch_cfg).generate(prompts, greedy)]
assert not calls["gemv"] and not calls["gemm"] and ours == torchs, (ours, torchs)
print("same answers")
"""


@needs_our_kernels
@pytest.mark.skipif("avx2" not in Host.read().cpu_flags, reason="torch's x86 builds need an AVX2 CPU")
def test_an_engine_held_to_avx2_runs_on_our_gemv_and_gemm_and_answers_as_torchs_kernels():
    """torch held to its AVX2 build (its AVX2 packing, checked against pack_avx2) and AVX-512 hidden from
    the plan: decode steps take our AVX2 GEMV, prefill our AVX2 GEMM, and the tiny LLaVA's greedy tokens
    are those of torch's int4 kernel and tiles."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}
    done = subprocess.run([sys.executable, "-c", ENGINE_ON_AVX2], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (f"rows 1-{INT4_GEMV_ROWS_AVX2}=ours int4 gemv (avx2), rows {INT4_GEMV_ROWS_AVX2 + 1}+=ours int4 gemm "
            "(avx2)") in done.stdout and "same answers" in done.stdout
