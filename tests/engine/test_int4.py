"""int4 weight-only quantization: the group rule, torch's packed layout read back, both multiply paths,
the refusals, the memory it is planned with, and an engine's greedy answers on the tiny LLaVA."""
import dataclasses

import pytest
import torch

from appliance.engine import cpu_kernels, int4
from appliance.engine.checkpoint_facts import CheckpointFacts
from appliance.engine.config import EngineConfig
from appliance.engine.host import Host
from appliance.engine.int4 import Int4Plan, Int4Weight, kernel_problem, learn_layout, quantize_groups
from appliance.engine.kernel_plan import INT4_GEMV_ROWS, INT4_GEMV_ROWS_AVX2, INT4_KERNEL_ROWS, \
    INT4_KERNEL_ROWS_TORCH_TILES, choose_kernels, int4_plan
from appliance.errors import ConfigError

LAYOUT = learn_layout()
BF16 = Int4Plan(32, INT4_KERNEL_ROWS, torch.bfloat16, LAYOUT, (32, 64, 128))
FP32 = dataclasses.replace(BF16, dtype=torch.float32)


def formula(q, scale, zero):
    """The format's own dequantisation, (q - 8) · scale + zero per group, in float64."""
    n, k = q.shape
    groups = scale.shape[1]
    w = (q.double().reshape(n, groups, k // groups) - 8) * scale.double()[..., None] + zero.double()[..., None]
    return w.reshape(n, k)


@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_group_spans_16_levels_from_its_min_to_its_max(group_size, dtype):
    torch.manual_seed(group_size)
    weight = torch.randn(48, 256) * 0.05
    q, scale, zero = quantize_groups(weight, group_size, dtype)
    assert q.dtype == torch.int32 and q.min() == 0 and q.max() == 15
    groups = q.reshape(48, -1, group_size)
    assert (groups.amin(dim=2) == 0).all() and (groups.amax(dim=2) == 15).all()  # both ends of every group
    assert torch.equal(scale.to(dtype).float(), scale) and torch.equal(zero.to(dtype).float(), zero)  # as stored
    error = (formula(q, scale, zero) - weight.double()).abs().reshape(48, -1, group_size).amax(dim=2)
    # half a step, and the stored scale's and zero's rounding (bf16: 2^-8 of them, over up to 15 steps)
    slack = 0 if dtype == torch.float32 else 2 ** -8 * (15 * scale + zero.abs()).double()
    assert (error <= scale.double() / 2 + slack + 1e-7).all()


def test_quantising_in_chunks_matches_at_once(monkeypatch):
    weight = torch.randn(208, 64)
    whole = Int4Weight(weight, BF16)
    monkeypatch.setattr(int4, "QUANT_CHUNK_ROWS", 64)
    chunked = Int4Weight(weight, BF16)
    assert torch.equal(whole.packed, chunked.packed) and torch.equal(whole.scales_and_zeros, chunked.scales_and_zeros)


def test_this_hosts_packing_is_learned_and_read_back():
    assert LAYOUT.block_rows in (32, 64)  # torch's AVX-512 or AVX2/plain builds
    assert kernel_problem(LAYOUT, torch.bfloat16) is None and kernel_problem(LAYOUT, torch.float32) is None
    swapped = dataclasses.replace(LAYOUT, orders=tuple((rows, tuple(reversed(order))) for rows, order in LAYOUT.orders))
    assert "an order the tiles do not read" in kernel_problem(swapped, torch.float32)
    halves = tuple(i // 2 + 8 * (i % 2) for i in range(16))  # a byte holding rows i and i + 8: readable, but wrong
    short_wrong = dataclasses.replace(LAYOUT, orders=((16, halves),) + LAYOUT.orders[1:])
    assert kernel_problem(short_wrong, torch.float32) == ("torch's int4 packing on this CPU is not the layout the "
                                                          "dequantised tiles read")


@pytest.mark.parametrize("n", [16, 48, 208, 1104])  # a short block alone; full blocks and a short last one
def test_the_weight_dequantises_to_the_formula(n):
    torch.manual_seed(n)
    weight = torch.randn(n, 96) * 0.05
    w4 = Int4Weight(weight, FP32)
    q, scale, zero = quantize_groups(weight, 32, torch.float32)
    assert torch.allclose(w4.dequantized().double(), formula(q, scale, zero), rtol=0, atol=1e-6)
    assert w4.nbytes == n * 96 // 2 + 3 * n * 2 * 4


ROWS = [1, 7, 64, INT4_KERNEL_ROWS + 1, 200]  # the kernel; past it, the dequantised tiles


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("plan", [BF16, FP32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_matches_the_dequantised_weights_in_fp32(rows, plan, dtype, monkeypatch):
    monkeypatch.setattr(int4, "TILE_ROWS", 128)  # several tiles, the last one partial
    torch.manual_seed(rows)
    weight, bias = torch.randn(208, 128) * 0.05, torch.randn(208)
    w4 = Int4Weight(weight, plan)
    x = torch.randn(2, rows, 128).to(dtype)
    y = w4.linear(x, bias.to(dtype))
    expected = x.float() @ w4.dequantized().t() + bias.to(dtype).float()
    assert y.dtype == dtype and y.shape == (2, rows, 208)
    tight = plan is FP32 and dtype == torch.float32
    tolerance = 1e-4 if tight else 0.03  # bf16 activations, tiles or outputs: 2^-8 of sums of ~1
    assert torch.allclose(y.float(), expected, rtol=tolerance, atol=tolerance)


def test_the_kernel_runs_up_to_the_plans_rows_and_tiles_past_them(monkeypatch):
    calls = []
    kernel = torch.ops.aten._weight_int4pack_mm_for_cpu
    monkeypatch.setattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu", lambda *a: calls.append(a) or kernel(*a))
    w4 = Int4Weight(torch.randn(64, 64), dataclasses.replace(BF16, kernel_rows=4))
    w4.linear(torch.randn(4, 64))
    w4.linear(torch.randn(5, 64))
    assert [a[0].shape[0] for a in calls] == [4]


@pytest.mark.parametrize("shape, group, message", [
    ((64, 96), 64, "layers.0.down has 96 input features (per rank), not a multiple of "
                   "engine.quantization_group_size=64; group sizes that fit: 32"),
    ((64, 48), 32, "layers.0.down has 48 input features (per rank), not a multiple of "
                   "engine.quantization_group_size=32; no group size fits; use engine.quantization=int8"),
    ((40, 128), 32, "layers.0.down has 40 output features (per rank), not a multiple of 16 as torch's int4 "
                    "kernel needs; use engine.quantization=int8"),
])
def test_a_layer_the_groups_do_not_fit_is_named_with_what_would(shape, group, message):
    assert int4.layer_problem("layers.0.down", *shape, group, (32, 64, 128)) == message
    assert int4.layer_problem("layers.0.down", 64, 128, group, (32, 64, 128)) is None


def test_a_model_with_such_a_layer_is_refused_before_any_is_quantised():
    from appliance.engine.linear import ColumnParallelLinear, RowParallelLinear, quantize_projections
    from appliance.engine.parallel import ParallelState

    model = torch.nn.ModuleDict({"up": ColumnParallelLinear(128, 64, ParallelState()),
                                 "down": RowParallelLinear(96, 64, ParallelState())})
    with pytest.raises(ConfigError, match="engine.quantization=int4 cannot hold down has 96 input features .*"
                                          "group sizes that fit: 32") as e:
        quantize_projections(model, dataclasses.replace(BF16, group_size=128))
    assert e.value.param == "engine.quantization_group_size"
    assert all(m.quantized is None for m in model.values())
    saved = quantize_projections(model, BF16)
    assert saved == (128 * 64 + 96 * 64) * 4 - sum(m.quantized.nbytes for m in model.values())


def test_the_group_size_is_one_of_the_kernels_and_int4_runs_on_cpu_generate_engines():
    from appliance.config.compose import compose

    assert EngineConfig().quantization_group_size == 128
    with pytest.raises(ConfigError, match=r"engine.quantization_group_size: 48; allowed: 32, 64, 128"):
        EngineConfig(quantization="int4", quantization_group_size=48)
    with pytest.raises(ConfigError, match="engine.quantization=int4 runs on CPU"):
        EngineConfig(quantization="int4", device="cuda")
    with pytest.raises(ConfigError, match="engine.quantization=int4 applies to a language model"):
        compose(["pipeline=prithvi_flood", "engine.quantization=int4"])


AMX = frozenset({"avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"})
VNNI = frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"})  # an EPYC's, no AMX


@pytest.mark.parametrize("flags, dtype", [(frozenset({"avx2", "fma"}), torch.float32), (AMX, torch.bfloat16),
                                          (VNNI, torch.bfloat16), (AMX | VNNI, torch.bfloat16)],
                         ids=["avx2", "amx", "vnni", "amx-vnni"])
@pytest.mark.parametrize("off", [None, "engine.cpu_kernels=false"])
def test_the_plan_holds_the_group_the_units_dtype_and_this_torchs_layout(flags, dtype, off):
    host = Host(flags, 16 << 30, 16 << 30)
    plan = choose_kernels(EngineConfig(dtype="bfloat16", quantization="int4", quantization_group_size=64), host,
                          off, "cpu")
    ours = off is None
    vnni = ours and flags == VNNI and LAYOUT.panels_fast  # AMX's bf16 tiles stay
    assert plan.int8 is None and plan.int4 == int4_plan(host, 64, ours)
    avx2 = ours and not vnni and LAYOUT.avx2_fast  # torch's AVX2 packing: our AVX2 GEMV and GEMM
    assert (plan.int4.group_size, plan.int4.dtype, plan.int4.layout, plan.int4.ours, plan.int4.vnni,
            plan.int4.gemm) == (64, dtype, LAYOUT, ours, vnni, vnni or avx2)
    assert plan.int4.group_sizes == (32, 64, 128)
    line = plan.describe()
    assert "gemm bfloat16 (unquantized weights)" in line
    if vnni:  # torch's int4 kernel runs nowhere: our GEMV, then our GEMM
        assert (plan.int4.gemv_rows, plan.int4.kernel_rows) == (INT4_GEMV_ROWS, 0)
        assert (f"gemm int4 (groups of 64) rows 1-{INT4_GEMV_ROWS}=ours int4 gemv, rows {INT4_GEMV_ROWS + 1}+=ours "
                f"vpdpbusd;") in line
        return
    if avx2:  # torch's int4 kernel runs nowhere: our AVX2 GEMV, then our AVX2 GEMM
        assert (plan.int4.gemv_rows, plan.int4.kernel_rows) == (INT4_GEMV_ROWS_AVX2, 0)
        assert (f"gemm int4 (groups of 64) rows 1-{INT4_GEMV_ROWS_AVX2}=ours int4 gemv (avx2), "
                f"rows {INT4_GEMV_ROWS_AVX2 + 1}+=ours int4 gemm (avx2);") in line
        return
    rows = INT4_KERNEL_ROWS if ours else INT4_KERNEL_ROWS_TORCH_TILES
    assert (plan.int4.gemv_rows, plan.int4.kernel_rows) == (0, rows)
    tiles = f"{'ours' if ours else 'torch'} {str(dtype).replace('torch.', '')} tiles"
    assert f"gemm int4 (groups of 64) rows 1-{rows}=torch int4 kernel, rows {rows + 1}+={tiles};" in line


@pytest.mark.parametrize("features_off", [["avx512_vnni"], ["avx512bw"]])
def test_cpu_features_off_takes_the_vnni_gemv_and_gemm_away(features_off):
    host = Host(VNNI, 16 << 30, 16 << 30).without(features_off)
    plan = int4_plan(host, 128, True)
    avx2 = LAYOUT.avx2_fast  # torch's AVX2 packing: our AVX2 GEMV and GEMM
    assert not plan.vnni and plan.gemm == avx2
    assert (plan.gemv_rows, plan.kernel_rows) == ((INT4_GEMV_ROWS_AVX2, 0) if avx2 else (0, INT4_KERNEL_ROWS))


def test_the_gemv_needs_torchs_avx512_packing():
    """The VNNI GEMV reads only torch's AVX-512 packing (64-row blocks, a byte holding rows j and j + 32)
    in place: with the plain build's (which no GEMV reads), a VNNI host keeps torch's int4 kernel for few
    rows and tiles past them."""
    other = int4.Int4Layout(32, ((16, tuple(range(16))), (32, tuple(range(32)))))  # the plain build's: 2j, 2j + 1
    plan = int4_plan(Host(VNNI, 16 << 30, 16 << 30), 128, True)
    assert plan.gemv_rows == (INT4_GEMV_ROWS if LAYOUT.panels_fast else INT4_GEMV_ROWS_AVX2 if LAYOUT.avx2_fast else 0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("appliance.engine.kernel_plan.learn_layout", lambda: other)
        plan = int4_plan(Host(VNNI, 16 << 30, 16 << 30), 128, True)
    assert (plan.gemv_rows, plan.kernel_rows, plan.vnni, plan.gemm) == (0, INT4_KERNEL_ROWS, False, False)


needs_our_kernels = pytest.mark.skipif(not cpu_kernels.available(),
                                       reason=f"CPU kernels unavailable: {cpu_kernels.unavailable_reason()}")


@needs_our_kernels
@pytest.mark.parametrize("n", [16, 48, 208, 1104])  # a short block alone; full blocks and a short last one
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_our_tiles_are_torchs_op_tiles_bit_for_bit(n, dtype, monkeypatch):
    """Our kernel rounds the product and the sum as torch's ops do (in bf16 tiles: each to bf16), so a
    plan with our kernels on multiplies as one with them off, in every tile dtype and tile of a layer."""
    monkeypatch.setattr(int4, "TILE_ROWS", 128)  # tiles starting past 0, the last one partial
    torch.manual_seed(n)
    weight = torch.randn(n, 192) * 0.05
    ours = Int4Weight(weight, dataclasses.replace(BF16, dtype=dtype, ours=True))
    torchs = Int4Weight(weight, dataclasses.replace(BF16, dtype=dtype))
    assert torch.equal(ours.packed, torchs.packed)
    for tiles in (torch.float32, torch.bfloat16):
        assert torch.equal(ours.dequantized(tiles), torchs.dequantized(tiles))
    q, scale, zero = quantize_groups(weight, 32, dtype)
    assert torch.allclose(ours.dequantized().double(), formula(q, scale, zero), rtol=0, atol=1e-6)
    x = torch.randn(2 * INT4_KERNEL_ROWS, 192)
    assert torch.equal(ours.linear(x), torchs.linear(x))


@needs_our_kernels
@pytest.mark.parametrize("change, message", [
    (dict(block_rows=48), "block_rows must be even, at most 64 and divide the 64 packed rows, got 48"),
    (dict(group_size=48), "group_size must divide K = 128, got 48"),
    (dict(scale=torch.ones(4, 32)), r"scale and offset must be contiguous \[4, 64\], got \[4, 32\] and \[4, 64\]"),
    (dict(out=torch.empty(128, 64, dtype=torch.float16)), "out must be a 2-D float32 or bf16 CPU tensor"),
    (dict(out=torch.empty(64, 64)), r"out must be \[128, 64\], got \[64, 64\]"),
])
def test_our_tile_kernel_refuses_arguments_it_cannot_read(change, message):
    args = dict(packed=torch.zeros(64, 64, dtype=torch.uint8), scale=torch.ones(4, 64), offset=torch.ones(4, 64),
                block_rows=32, halves=True, group_size=32, out=torch.empty(128, 64))
    cpu_kernels.int4_tiles_(**args)
    assert torch.equal(args["out"], torch.ones(128, 64))  # q = 0: w = the offset
    with pytest.raises(ValueError, match=message):
        cpu_kernels.int4_tiles_(**{**args, **change})


needs_vnni = pytest.mark.skipif(not cpu_kernels.available() or not {"avx512_vnni", "avx512bw"} <= Host.read().cpu_flags,
                                reason="our int4 GEMM runs on CPUs with AVX512-VNNI and our kernels loaded")


def int8_x_bound(x: torch.Tensor, w: torch.Tensor, group_size: int) -> torch.Tensor:
    """The most rounding x to int8 per row and group can move x Wᵀ: each x off by at most half its row's and
    group's step (largest |x| / 127), times the |w| it meets."""
    m, k = x.shape
    step = x.reshape(m, k // group_size, group_size).abs().amax(dim=2) / 127
    return (step / 2) @ w.abs().reshape(w.shape[0], k // group_size, group_size).sum(dim=2).t()


@needs_vnni
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("rows", [33, 100, 513])
@pytest.mark.parametrize("plan", [BF16, FP32], ids=["bf16", "fp32"])
def test_our_vnni_gemm_is_the_dequantised_product_within_x_int8_rounding(group_size, rows, plan):
    """Past the plan's GEMV rows: K = 640 (not a multiple of the int8 GEMM's 512), N = 1104 (17 full 64-row
    blocks, a 16-row last one: half a 32-output panel); each row's zeros far from 0 and x's mean not 0, so
    that the zero term counts; bf16 or fp32 scales and zeros."""
    torch.manual_seed(rows + group_size)
    n, k = 1104, 640
    weight = torch.randn(n, k) * 0.05 + torch.linspace(-0.2, 0.2, n)[:, None]
    w4 = Int4Weight(weight, dataclasses.replace(plan, group_size=group_size, kernel_rows=0, gemv_rows=0,
                                                ours=True, vnni=True, gemm=True))
    x = (torch.randn(rows, k) + 0.5).to(plan.dtype).float()  # as the plan's dtype holds it: x itself is exact
    w = w4.dequantized()
    error = (w4.linear(x) - x @ w.t()).abs()
    bound = int8_x_bound(x, w, group_size) + 1e-5 * (x.abs() @ w.abs().t())  # + the fp32 sums' rounding
    assert (error <= bound).all(), f"{(error - bound).max()} past the bound"
    assert error.max() > 0  # x was rounded to int8: the VPDPBUSD GEMM ran, not tiles


@needs_vnni
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("rows", [1, 2, 3, 5])
@pytest.mark.parametrize("n", [1104, 1072])  # 17 full 64-row blocks and a 16-row last one; 16 and a 48-row one
@pytest.mark.parametrize("plan", [BF16, FP32], ids=["bf16", "fp32"])
def test_our_vnni_gemv_is_the_dequantised_product_within_x_int8_rounding_and_the_gemms_bits(group_size, rows, n,
                                                                                            plan, monkeypatch):
    """Up to the plan's GEMV rows (5: a 4-row pass and a 1-row one), the GEMV reads torch's bytes in place:
    within x's int8 rounding of the dequantised product, as the GEMM test above measures it (K = 640, zeros
    far from 0, x's mean not 0), and the same bits as the GEMM, which quantises x and scales groups alike."""
    calls = []
    gemv = cpu_kernels.gemv_int4
    monkeypatch.setattr(cpu_kernels, "gemv_int4", lambda x, *a: calls.append(x.shape[0]) or gemv(x, *a))
    torch.manual_seed(rows + group_size + n)
    k = 640
    weight = torch.randn(n, k) * 0.05 + torch.linspace(-0.2, 0.2, n)[:, None]
    w4 = Int4Weight(weight, dataclasses.replace(plan, group_size=group_size, kernel_rows=0, gemv_rows=5, ours=True,
                                                vnni=True, gemm=True))
    x = (torch.randn(rows, k) + 0.5).to(plan.dtype).float()
    w = w4.dequantized()
    y = w4.linear(x)
    assert calls == [rows]
    error = (y - x @ w.t()).abs()
    bound = int8_x_bound(x, w, group_size) + 1e-5 * (x.abs() @ w.abs().t())
    assert (error <= bound).all(), f"{(error - bound).max()} past the bound"
    assert error.max() > 0
    gemm = Int4Weight.__new__(Int4Weight)
    gemm.__dict__.update(w4.__dict__, plan=dataclasses.replace(w4.plan, gemv_rows=0))
    assert torch.equal(y, gemm.linear(x)) and calls == [rows]


@needs_our_kernels
@pytest.mark.parametrize("rows", [0, 2])
def test_our_int4_gemv_refuses_rows_torchs_avx512_packing_cannot_hold(rows):
    args = dict(x=torch.ones(rows, 128), packed=torch.zeros(24, 64, dtype=torch.uint8),
                scales_and_zeros=torch.ones(4, 24, 2), tail_halves=True, group_size=32)
    with pytest.raises(ValueError, match="the int4 GEMV reads torch's AVX-512 packing, whose rows come in 16s, got 24"):
        cpu_kernels.gemv_int4(**args)


@needs_our_kernels
@pytest.mark.parametrize("change, message", [
    (dict(x=torch.ones(4, 64)), r"int4 linear takes x \[M, 128\] for packed \[64, 64\], got x \[4, 64\]"),
    (dict(group_size=48), "group_size must be a multiple of 4 up to 128 that divides K = 128, got 48"),
    (dict(block_rows=80), "block_rows must be even and at most 64"),
    (dict(scales_and_zeros=torch.ones(4, 64, 2, dtype=torch.float16)), "scales_and_zeros must be a contiguous float32"),
    (dict(scales_and_zeros=torch.ones(2, 64, 2)), r"scales_and_zeros must be .* \[4, 64, 2\], got Float \[2, 64, 2\]"),
])
def test_our_int4_gemm_and_gemv_refuse_arguments_they_cannot_read(change, message):
    args = dict(x=torch.ones(4, 128), packed=torch.zeros(64, 64, dtype=torch.uint8),
                scales_and_zeros=torch.ones(4, 64, 2), block_rows=64, halves=True, tail_halves=False, group_size=32)
    gemv_args = {name: value for name, value in args.items() if name not in ("block_rows", "halves")}
    if {"avx512_vnni", "avx512bw"} <= Host.read().cpu_flags:  # q = 0, scale 1, zero 1: w = -7
        assert torch.equal(cpu_kernels.linear_int4(**args), torch.full((4, 64), -7.0 * 128))
        assert torch.equal(cpu_kernels.gemv_int4(**gemv_args), torch.full((4, 64), -7.0 * 128))
    with pytest.raises(ValueError, match=message):
        cpu_kernels.linear_int4(**{**args, **change})
    if "block_rows" not in change:  # the checks the GEMV shares
        with pytest.raises(ValueError, match=message):
            cpu_kernels.gemv_int4(**{**gemv_args, **change})


B7, B7_PROJECTIONS = 6_900_000_000, 6_480_000_000  # a LLaVA-1.5-7B's weights and its decoder's projections


def test_int4_weights_count_half_a_byte_and_a_scale_and_zero_a_group():
    facts = CheckpointFacts(torch.bfloat16, B7, 0, B7_PROJECTIONS)
    others = (B7 - B7_PROJECTIONS) * 2
    assert facts.weight_bytes(torch.bfloat16, int4_group=128) == others + B7_PROJECTIONS // 2 + B7_PROJECTIONS // 16
    assert facts.weight_bytes(torch.bfloat16, int4_group=32) == others + B7_PROJECTIONS // 2 + B7_PROJECTIONS // 4
    assert facts.weight_bytes(torch.bfloat16, int4_group=128) < facts.weight_bytes(torch.bfloat16, int8=True)


def test_int4_leaves_the_kv_cache_more_room_and_is_named_where_only_it_fits():
    from appliance.engine.attention_geometry import AttentionGeometry
    from appliance.engine.memory_plan import GIB, plan_memory

    kv = AttentionGeometry(num_heads=32, num_kv_heads=32, head_dim=128, block_size=16, num_layers=32)
    facts = CheckpointFacts(torch.bfloat16, B7, 0, B7_PROJECTIONS)

    def planned(gib, **cfg):
        return plan_memory(EngineConfig(device="cpu", **cfg), facts, Host(AMX, int(gib * GIB), int(gib * GIB)),
                           "model M", kv, 4096)

    assert planned(16, quantization="int4").kv_cache_memory_bytes == planned(16, quantization="int8") \
        .kv_cache_memory_bytes == 4 * GIB  # both reach the 4 GiB cap; int4 with room to spare:
    assert planned(15.5, quantization="int4", max_num_seqs=1).dtype == torch.bfloat16
    with pytest.raises(ConfigError, match=r"engine\.quantization=int4 would need 14\.\d GiB, which fits"):
        planned(16, quantization="int8", kv_cache_memory_bytes=9 * GIB)  # int8: 6.8 + 9 + 1 GiB
    with pytest.raises(ConfigError, match="does not fit"):
        planned(13, quantization="int4")  # 12.9 GiB of bf16 + 1 GiB reserve while loading


def test_an_int4_llava_answers_as_its_dequantised_weights_do():
    """The tiny LLaVA (trained weights; its projections 128 and 384 wide: every group size fits) with int4
    projections gives the greedy tokens of the same model with each projection replaced by its
    dequantised weights (engine dtype bf16 both, torch's kernels); how often it agrees with bf16 is shown."""
    from appliance.engine.linear import ColumnParallelLinear, RowParallelLinear
    from appliance.engine.llm_engine import LLMEngine
    from appliance.engine.sampling_params import SamplingParams
    from tests.engine.helpers import random_prompts
    from tests.servers import LLAVA_TINY

    prompts = random_prompts(399, [5, 17, 30, 9, 12, 23], seed=41)
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    base = dict(num_kv_blocks=64, dtype="bfloat16", cpu_kernels=False)

    def projections(engine):
        return [m for m in engine.executor.runner.model.modules()
                if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]

    quantized = LLMEngine(str(LLAVA_TINY), EngineConfig(quantization="int4", quantization_group_size=32, **base))
    layers = projections(quantized)
    assert layers and all(isinstance(m.quantized, Int4Weight) and m.weight.numel() == 0 for m in layers)
    int4_tokens = [a.token_ids for a in quantized.generate(prompts, greedy)]

    reference = LLMEngine(str(LLAVA_TINY), EngineConfig(**base))
    for mine, theirs in zip(projections(reference), layers):
        mine.weight.data = theirs.quantized.dequantized(torch.bfloat16)
    assert [a.token_ids for a in reference.generate(prompts, greedy)] == int4_tokens

    bf16_tokens = [a.token_ids for a in LLMEngine(str(LLAVA_TINY), EngineConfig(**base)).generate(prompts, greedy)]
    same = sum(a == b for x, y in zip(int4_tokens, bf16_tokens) for a, b in zip(x, y))
    print(f"int4 (groups of 32) agrees with bf16 on {same} of {8 * len(prompts)} greedy tokens")


@pytest.mark.parametrize("overrides, refusal", [
    (["engine.quantization_group_size=128"], "model.layers.0.mlp.gate_proj has 64 input features (per rank), not "
                                             "a multiple of engine.quantization_group_size=128; group sizes that "
                                             "fit: 32, 64"),
    (["engine.quantization_group_size=64", "engine.tensor_parallel_size=2"],
     "model.layers.0.self_attn.o_proj has 32 input features (per rank), not a multiple of "
     "engine.quantization_group_size=64; group sizes that fit: 32"),
    (["engine.quantization_group_size=32", "engine.tensor_parallel_size=2"], None),
])
def test_check_refuses_a_checkpoint_whose_projections_the_groups_do_not_fit(llama_dir, overrides, refusal):
    """Read from the safetensors headers while the config is composed (`appliance check`), before any
    weight loads: the tiny Llama is 64 wide (its MLP 128), its row-parallel layers split by inputs."""
    from appliance.config.compose import compose

    args = ["pipeline=llava_chat", f"model.path={llama_dir}", "engine.quantization=int4", *overrides]
    if refusal is None:
        assert compose(args).engine.quantization_group_size == 32
        return
    with pytest.raises(ConfigError) as e:
        compose(args)
    assert str(e.value) == f"engine.quantization=int4 cannot hold {refusal}"


READ_BACK = """
import dataclasses
import torch
from appliance.engine import cpu_kernels, int4
from appliance.engine.host import Host
layout = int4.learn_layout()
VNNI = {"avx512_vnni", "avx512bw"} <= Host.read().cpu_flags
assert int4.kernel_problem(layout, torch.float32) is None
plan = int4.Int4Plan(32, 4, torch.float32, layout)
for n in (16, 48, 208):
    weight = int4.Int4Weight(torch.randn(n, 96) * 0.05, plan)
    for rows in (3, 9):  # the kernel, the tiles
        x = torch.randn(rows, 96)
        assert torch.allclose(weight.linear(x), x @ weight.dequantized().t(), rtol=1e-5, atol=1e-5)
    if cpu_kernels.available():  # our kernel reads this layout as torch's ops do
        ours = int4.Int4Weight(torch.randn(n, 96) * 0.05, dataclasses.replace(plan, ours=True))
        for dtype in (torch.float32, torch.bfloat16):
            torchs = int4.dequantize_transposed(ours.packed, ours.scales_and_zeros, 0, n, plan, dtype)
            assert torch.equal(ours.tile_transposed(0, n, dtype), torchs)
        if VNNI:  # our int4 GEMM reads it too (nibble by nibble: the plan keeps tiles for such a layout)
            x, tail = torch.randn(9, 96), n % layout.block_rows
            y = cpu_kernels.linear_int4(x, ours.packed, ours.scales_and_zeros, layout.block_rows,
                                        layout.halves(layout.block_rows), tail > 0 and layout.halves(tail), 32)
            assert torch.allclose(y, x @ ours.dequantized().t(), rtol=0.02, atol=0.02)
print(torch.backends.cpu.get_cpu_capability(), layout.block_rows, cpu_kernels.available())
"""


@pytest.mark.skipif("avx2" not in Host.read().cpu_flags, reason="torch's x86 builds need an AVX2 CPU")
@pytest.mark.parametrize("capability, block_rows", [("avx2", 32), ("default", 32)])
def test_torchs_other_cpu_builds_pack_layouts_the_tiles_read(capability, block_rows):
    """torch packs int4 weights differently in its AVX2 and plain builds (ATEN_CPU_CAPABILITY picks one on
    any x86 CPU): each is learned, checked and read back, by torch's ops and by our kernel."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability}
    done = subprocess.run([sys.executable, "-c", READ_BACK], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [capability.upper(), str(block_rows), str(cpu_kernels.available())]


def test_two_ranks_quantise_their_shards_and_answer_as_one():
    """Tensor parallelism splits the projections before they are quantised (row-parallel layers by their
    inputs: each rank's groups are the whole model's); the plan's learned layout travels to the ranks."""
    from appliance.engine.llm_engine import LLMEngine
    from appliance.engine.sampling_params import SamplingParams
    from tests.engine.helpers import random_prompts
    from tests.servers import LLAVA_TINY

    prompts = random_prompts(399, [7, 4, 19], seed=43)
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    answers = {}
    for ranks in (1, 2):
        cfg = EngineConfig(num_kv_blocks=32, dtype="bfloat16", quantization="int4", quantization_group_size=32,
                           tensor_parallel_size=ranks)
        answers[ranks] = [a.token_ids for a in LLMEngine(str(LLAVA_TINY), cfg).generate(prompts, greedy)]
    assert answers[2] == answers[1]
