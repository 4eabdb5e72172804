"""Our AVX2 kernels (appliance/engine/csrc/, a file a family) against the torch code they replace."""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from appliance.engine import cpu_kernels
from appliance.engine.host import Host
from appliance.engine.layers import RMSNorm, RotaryEmbedding, SiluAndMul

pytestmark = pytest.mark.skipif(not cpu_kernels.available(),
                                reason=f"CPU kernels unavailable: {cpu_kernels.unavailable_reason()}")


def close(a, b, tol=1e-5):
    """Equal up to fp32 summation order, relative to the tensors' scale."""
    scale = max(b.abs().max().item(), 1.0)
    assert a.shape == b.shape
    assert (a - b).abs().max().item() <= tol * scale, (a - b).abs().max().item()


@pytest.mark.parametrize("m", [1, 5, 6, 7, 37, 130])  # 130 > one 120-row x block
@pytest.mark.parametrize("n, k", [(1, 8), (15, 7), (16, 64), (17, 512), (100, 600)])  # 600 > one K pass
def test_packed_linear_matches_torch(m, n, k):
    x, w, b = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
    packed = cpu_kernels.PackedWeight(w)
    close(cpu_kernels.linear(x, packed), F.linear(x, w))
    close(cpu_kernels.linear(x, packed, b), F.linear(x, w, b))


def test_packed_linear_takes_strided_rows_and_leading_dims():
    w = torch.randn(24, 32)
    packed = cpu_kernels.PackedWeight(w)
    rows = torch.randn(10, 48)[:, 8:40]  # row stride 48
    close(cpu_kernels.linear(rows, packed), F.linear(rows, w))
    x3 = torch.randn(2, 3, 32)
    close(cpu_kernels.linear(x3, packed), F.linear(x3, w))
    assert cpu_kernels.linear(torch.randn(0, 32), packed).shape == (0, 24)


def test_packed_linear_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="fp32, bf16 or int8 CPU weights"):
        cpu_kernels.PackedWeight(torch.randn(4, 8, dtype=torch.float16))
    packed = cpu_kernels.PackedWeight(torch.randn(4, 8))
    with pytest.raises(ValueError, match=r"input \[\.\.\., 8\]"):
        cpu_kernels.linear(torch.randn(2, 9), packed)
    with pytest.raises(ValueError, match="float32 CPU input"):
        cpu_kernels.linear(torch.randn(2, 8, dtype=torch.bfloat16), packed)
    with pytest.raises(ValueError, match="an int8 weight packs with its scales"):
        cpu_kernels.PackedWeight(torch.ones(4, 8, dtype=torch.int8))
    with pytest.raises(ValueError, match="an int8 weight packs with its scales"):
        cpu_kernels.PackedWeight(torch.randn(4, 8), scale=torch.ones(4))


BF16_UNITS = "avx512_bf16" in Host.read().cpu_flags


def bf16_close(y, x, w):
    """y (bf16) is x wᵀ in float64 rounded to bf16, up to fp32 summation order."""
    expected = x.double() @ w.double().t()
    assert y.dtype == torch.bfloat16 and y.shape == expected.shape
    error = (y.double() - expected).abs()
    assert (error <= expected.abs() * 2 ** -8 + 1e-5 * max(expected.abs().max().item(), 1.0)).all(), error.max()


@pytest.mark.skipif(not BF16_UNITS, reason="the packed bf16 GEMM needs AVX512-BF16")
@pytest.mark.parametrize("m", [1, 2, 3, 8, 9, 17, 200])  # the 1-2 row paths, a full 8-row tile, 200 > a 192-row block
@pytest.mark.parametrize("n, k", [(1, 8), (5, 7), (33, 77), (32, 512), (40, 513), (70, 1100)])  # odd K; > one K pass
def test_packed_bf16_linear_matches_the_weight_in_float64(m, n, k):
    torch.manual_seed(m * 1000 + n + k)
    x, w = torch.randn(m, k).to(torch.bfloat16), torch.randn(n, k).to(torch.bfloat16)
    packed = cpu_kernels.PackedWeight(w)
    assert packed.data.dtype == torch.bfloat16
    bf16_close(cpu_kernels.linear(x, packed), x, w)


@pytest.mark.skipif(not BF16_UNITS, reason="the packed bf16 GEMM needs AVX512-BF16")
def test_packed_bf16_linear_takes_strided_rows_leading_dims_and_bias():
    w, b = torch.randn(24, 31).to(torch.bfloat16), torch.randn(24).to(torch.bfloat16)
    packed = cpu_kernels.PackedWeight(w)
    for rows in (torch.randn(10, 48).to(torch.bfloat16)[:, 8:39],  # row stride 48
                 torch.randn(10, 47).to(torch.bfloat16)[:, 8:39]):  # an odd row stride
        bf16_close(cpu_kernels.linear(rows, packed), rows, w)
    x3 = torch.randn(2, 3, 31).to(torch.bfloat16)
    bf16_close(cpu_kernels.linear(x3, packed).flatten(0, 1), x3.flatten(0, 1), w)
    assert torch.equal(cpu_kernels.linear(x3, packed, b), cpu_kernels.linear(x3, packed) + b)
    assert cpu_kernels.linear(torch.randn(0, 31).to(torch.bfloat16), packed).shape == (0, 24)
    with pytest.raises(ValueError, match="bfloat16 CPU input"):
        cpu_kernels.linear(torch.randn(2, 31), packed)


@pytest.mark.skipif(BF16_UNITS, reason="this CPU has AVX512-BF16")
def test_packed_bf16_linear_says_it_needs_bf16_units():
    packed = cpu_kernels.PackedWeight(torch.randn(4, 8).to(torch.bfloat16))  # packing is plain C
    with pytest.raises(RuntimeError, match="needs a CPU with AVX512-BF16"):
        cpu_kernels.linear(torch.randn(2, 8).to(torch.bfloat16), packed)


@pytest.mark.parametrize("m", [1, 3, 4, 5, 16])  # one x row group of 4, a partial one, several
@pytest.mark.parametrize("n, k", [(1, 8), (7, 13), (9, 40), (33, 77), (64, 4096)])  # odd N, K % 8 and % 16 tails
def test_int8_linear_matches_the_dequantised_weight_in_float64(m, n, k):
    torch.manual_seed(m * 1000 + n + k)
    x, q = torch.randn(m, k), torch.randint(-127, 128, (n, k), dtype=torch.int8)
    scale = torch.rand(n) * 0.01
    expected = x.double() @ (q.double() * scale.double()[:, None]).t()
    y = cpu_kernels.linear_int8(x, q, scale)
    assert y.dtype == torch.float32
    close(y.double(), expected, tol=1e-6 * k ** 0.5)


def test_int8_linear_takes_strided_rows_and_no_rows():
    q, scale = torch.randint(-127, 128, (5, 24), dtype=torch.int8), torch.rand(5)
    rows = torch.randn(3, 40)[:, 8:32]  # row stride 40
    close(cpu_kernels.linear_int8(rows, q, scale), rows @ (q.float() * scale[:, None]).t())
    assert cpu_kernels.linear_int8(torch.randn(0, 24), q, scale).shape == (0, 5)


@pytest.mark.parametrize("m", [1, 3, 4, 5, 16])
@pytest.mark.parametrize("n, k", [(1, 8), (7, 13), (9, 40), (33, 77), (64, 4096)])
@pytest.mark.parametrize("units", [True, False])  # AVX512-BF16 where the CPU has it; the AVX2 path
def test_bf16_weight_linear_matches_the_weight_in_float64(m, n, k, units):
    torch.manual_seed(m * 1000 + n + k)
    x, w = torch.randn(m, k).to(torch.bfloat16).float(), torch.randn(n, k).to(torch.bfloat16)  # a bf16 engine's x
    y = cpu_kernels.linear_bf16w(x, w, bf16_units=units)
    assert y.dtype == torch.float32
    close(y.double(), x.double() @ w.double().t(), tol=1e-6 * k ** 0.5)


def test_bf16_weight_linear_rounds_x_to_bf16_only_on_bf16_units():
    """With AVX512-BF16 the kernel multiplies bf16 pairs, so fp32 rows are rounded to bf16 first (nearest
    even); elsewhere it widens the weight and keeps x in fp32."""
    torch.manual_seed(7)
    x, w = torch.randn(3, 100), torch.randn(9, 100).to(torch.bfloat16)
    units = "avx512_bf16" in Host.read().cpu_flags
    expected = (x.to(torch.bfloat16).double() if units else x.double()) @ w.double().t()
    close(cpu_kernels.linear_bf16w(x, w).double(), expected, tol=1e-6 * 10)
    close(cpu_kernels.linear_bf16w(x, w, bf16_units=False).double(), x.double() @ w.double().t(), tol=1e-6 * 10)


def test_bf16_weight_linear_takes_strided_rows_and_no_rows():
    w = torch.randn(5, 24).to(torch.bfloat16)
    rows = torch.randn(3, 40).to(torch.bfloat16).float()[:, 8:32]  # row stride 40
    close(cpu_kernels.linear_bf16w(rows, w), rows @ w.float().t())
    assert cpu_kernels.linear_bf16w(torch.randn(0, 24), w).shape == (0, 5)


def reference_decode(q, k_cache, v_cache, tables, lens, scale):
    out = []
    for i, n in enumerate(lens.tolist()):
        k = k_cache[tables[i]].flatten(0, 1)[:n].transpose(0, 1)[None]
        v = v_cache[tables[i]].flatten(0, 1)[:n].transpose(0, 1)[None]
        out.append(F.scaled_dot_product_attention(q[i][None, :, None], k, v, scale=scale, enable_gqa=True)[0, :, 0])
    return torch.stack(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch", [1, 3, 16])  # few sequences: split in chunks of tokens; many: a task each
@pytest.mark.parametrize("heads, kv_heads, head_dim, block_size", [(4, 4, 8, 4), (8, 2, 64, 16), (6, 3, 128, 16)])
def test_paged_decode_attention_matches_sdpa(batch, heads, kv_heads, head_dim, block_size, dtype):
    """bf16 caches are read in place and computed in fp32: the reference is fp32 attention over the
    same bf16 values, and the answer comes back in q's dtype."""
    torch.manual_seed(batch)
    num_blocks, width = 128, 6
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim).to(dtype)
    lens = torch.randint(1, width * block_size + 1, (batch,))
    lens[0] = 1
    if batch > 1:
        lens[1] = width * block_size  # every slot of every block
    tables = torch.randperm(num_blocks)[: batch * width].view(batch, width)  # scattered blocks
    q = torch.randn(batch, heads, head_dim).to(dtype)
    got = cpu_kernels.paged_decode_attention(q, k_cache, v_cache, tables, lens, head_dim ** -0.5)
    expected = reference_decode(q.float(), k_cache.float(), v_cache.float(), tables, lens, head_dim ** -0.5)
    assert got.dtype == dtype
    if dtype == torch.float32:
        close(got, expected)
    else:  # only the output's rounding to bf16 differs
        assert torch.allclose(got.float(), expected, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("lens", [[700], [300, 1, 200], [64, 65]])
def test_long_sequences_split_in_chunks_match_sdpa(threads, lens):
    """Fewer sequences than twice the threads: each long one splits into chunks of whole blocks (at least
    64 tokens), computed apart and merged; short ones stay whole. The answer is the same attention."""
    torch.manual_seed(len(lens) + threads)
    kv_heads, heads, head_dim, block_size = 4, 8, 32, 16
    width = -(-max(lens) // block_size)
    k_cache = torch.randn(len(lens) * width + 3, block_size, kv_heads, head_dim).to(torch.bfloat16)
    v_cache = torch.randn(len(lens) * width + 3, block_size, kv_heads, head_dim).to(torch.bfloat16)
    tables = torch.randperm(k_cache.shape[0])[: len(lens) * width].view(len(lens), width)
    q = torch.randn(len(lens), heads, head_dim)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = cpu_kernels.paged_decode_attention(q, k_cache, v_cache, tables, torch.tensor(lens), 0.2)
    finally:
        torch.set_num_threads(before)
    close(got, reference_decode(q, k_cache.float(), v_cache.float(), tables, torch.tensor(lens), 0.2))


def test_rms_norm_matches_torch_path():
    norm = RMSNorm(96, eps=1e-5)
    norm.weight.data = torch.randn(96)
    x = torch.randn(300, 128)[:, :96]  # strided rows
    reference = norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    close(cpu_kernels.rms_norm(x, norm.weight, norm.eps), reference)
    cpu_kernels.use_in(norm)
    close(norm(x), reference)  # the layer dispatches to the kernel


def test_rotary_in_place_matches_torch_path():
    rope = RotaryEmbedding(32, 64)
    qkv = torch.randn(9, (4 + 2 + 2) * 32)
    q, k = qkv[:, :128].view(9, 4, 32), qkv[:, 128:192].view(9, 2, 32)  # views into the fused output
    positions = torch.tensor([0, 1, 2, 63, 5, 5, 7, 30, 8])
    ref_q, ref_k = rope(positions, q.clone(), k.clone())  # a layer starts on torch's kernels
    cpu_kernels.use_in(rope)
    untouched = qkv[:, 192:].clone()
    got_q, got_k = rope(positions, q, k)
    close(got_q, ref_q)
    close(got_k, ref_k)
    assert got_q.data_ptr() == q.data_ptr() and torch.equal(qkv[:, 192:], untouched)


@pytest.mark.parametrize("tokens", [5, 2100])  # 2100 x 32 floats: the rows are copied in parallel
def test_write_kv_matches_index_put(tokens):
    k_cache, v_cache = torch.zeros(640, 4, 2, 16), torch.zeros(640, 4, 2, 16)
    qkv = torch.randn(tokens, 3 * 32)
    k, v = qkv[:, 32:64].view(tokens, 2, 16), qkv[:, 64:].view(tokens, 2, 16)
    slots = torch.tensor([3, 0, 31, 17, 9]) if tokens == 5 else torch.randperm(2560)[:tokens]
    cpu_kernels.write_kv(k, v, slots, k_cache, v_cache)
    ref_k, ref_v = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    ref_k.view(-1, 2, 16)[slots] = k
    ref_v.view(-1, 2, 16)[slots] = v
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)


def test_silu_mul_takes_a_strided_input():
    x = torch.randn(300, 2 * 96 + 8)[:, 8:]  # rows of stride 200: copied to contiguous first
    close(cpu_kernels.silu_mul(x), F.silu(x[:, :96]) * x[:, 96:])


@pytest.mark.parametrize("rows, inter", [(1, 13), (32, 1408), (200, 64)])
def test_silu_mul_matches_torch(rows, inter):
    x = torch.randn(rows, 2 * inter) * 6  # wide range: exp's reduction and saturation
    x[0, 0], x[0, 1] = -100.0, 100.0
    close(cpu_kernels.silu_mul(x), F.silu(x[:, :inter]) * x[:, inter:])
    act = SiluAndMul()
    cpu_kernels.use_in(act)
    close(act(x), F.silu(x[:, :inter]) * x[:, inter:])


def bf16_inputs(*shape, scale=3.0):
    """bf16 values over a wide range, with a NaN and infinities: where rounding and special values show."""
    x = torch.randn(*shape) * scale
    x.view(-1)[:3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    return x.bfloat16()


def assert_same_bits(got, reference):
    """The same bits, but a NaN's (its sign and payload are not a result torch promises)."""
    assert got.dtype == reference.dtype == torch.bfloat16 and got.shape == reference.shape
    nan = reference.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(got.view(torch.int16)[~nan], reference.view(torch.int16)[~nan])


# bf16: each small op rounds where torch's bf16 path (layers.py) rounds, so a bf16 engine gives the same
# bits with our kernels on or off (4096 and 11008: Llama 7B's widths; 13 and 20: loop tails).
@pytest.mark.parametrize("rows, dim", [(1, 4096), (37, 13), (3, 4104)])
def test_bf16_rms_norm_gives_the_torch_paths_bits(rows, dim):
    norm = RMSNorm(dim, eps=1e-5).to(torch.bfloat16)
    norm.weight.data = bf16_inputs(dim, scale=1.0).nan_to_num(0.0, 1.0, -1.0)
    x = bf16_inputs(rows, dim + 8)[:, :dim]  # strided rows
    reference = norm(x)
    cpu_kernels.use_in(norm)
    assert_same_bits(norm(x), reference)


@pytest.mark.parametrize("rows, inter", [(1, 11008), (200, 20)])
def test_bf16_silu_mul_gives_the_torch_paths_bits(rows, inter):
    x = bf16_inputs(rows, 2 * inter, scale=6.0)
    x[0, 3:7] = torch.tensor([-88.5, -100.0, -3e38, 3e38])  # past exp's range: silu goes to -0, or x
    act = SiluAndMul()
    reference = act(x)
    cpu_kernels.use_in(act)
    assert_same_bits(act(x), reference)


@pytest.mark.parametrize("head_dim", [128, 20])
def test_bf16_rotary_gives_the_torch_paths_bits(head_dim):
    rope = RotaryEmbedding(head_dim, 4096).to(torch.bfloat16)
    rope.init_buffers()
    qkv = bf16_inputs(70, 14 * head_dim)  # 70 tokens: rotated in parallel
    q, k = qkv[:, :8 * head_dim].view(70, 8, head_dim), qkv[:, 8 * head_dim:10 * head_dim].view(70, 2, head_dim)
    positions = torch.randint(0, 4096, (70,))
    ref_q, ref_k = rope(positions, q.clone(), k.clone())
    cpu_kernels.use_in(rope)
    got_q, got_k = rope(positions, q, k)
    assert got_q.data_ptr() == q.data_ptr()
    assert_same_bits(got_q, ref_q)
    assert_same_bits(got_k, ref_k)


def test_bf16_write_kv_copies_the_rows():
    k_cache, v_cache = torch.zeros(64, 4, 2, 16, dtype=torch.bfloat16), torch.zeros(64, 4, 2, 16, dtype=torch.bfloat16)
    qkv = bf16_inputs(5, 3 * 32)
    k, v = qkv[:, 32:64].view(5, 2, 16), qkv[:, 64:].view(5, 2, 16)
    slots = torch.tensor([3, 0, 255, 17, 9])
    cpu_kernels.write_kv(k, v, slots, k_cache, v_cache)
    assert_same_bits(k_cache.view(-1, 2, 16)[slots], k)
    assert_same_bits(v_cache.view(-1, 2, 16)[slots], v)
    assert k_cache.count_nonzero() == v_cache.count_nonzero() == 5 * 32  # nothing else written


def test_argmax_rows_matches_torch_with_ties_and_nan():
    x = torch.randn(7, 1000)
    x[1, 10] = x[1, 500] = 50.0  # tie: the first index wins
    x[2, 3] = float("nan")  # NaN wins, as in torch
    assert torch.equal(cpu_kernels.argmax_rows(x), x.argmax(dim=-1))


def test_unbuildable_kernels_leave_the_engine_on_torch(tmp_path):
    """No working compiler: available() is False with the reason, and the engine's plan is torch's alone."""
    code = ("from appliance.engine import cpu_kernels as k; from appliance.engine.config import EngineConfig; "
            "from appliance.engine.host import Host; from appliance.engine.kernel_plan import plan_kernels; "
            "p = plan_kernels(EngineConfig(dtype='float32'), Host.read(), None); "
            "print(k.available(), p.attention, p.packed_gemm, p.fused_ops); print(p.cpu_kernels_off)")
    env = {**os.environ, "CC": str(tmp_path / "no-such-cc"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    first, reason = out.stdout.splitlines()
    assert first == "False torch False False"
    assert "no-such-cc" in reason


def test_fresh_cache_builds_once(tmp_path):
    code = ("from pathlib import Path; from appliance.engine import build_kernels as b, cpu_kernels as k; "
            f"b.PREBUILT_DIR = Path({str(tmp_path / 'no-prebuilt')!r}); print(k.available())")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    for _ in range(2):  # the second run loads what the first built
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "True"
    assert len(list((tmp_path / "appliance" / "kernels").glob("cpu_kernels-*.so"))) == 1


def _decode_args(**change):
    """Valid arguments of paged_decode_attention (2 sequences, 4 blocks of 4 tokens), with `change` applied."""
    args = dict(q=torch.randn(2, 4, 8), k_cache=torch.randn(4, 4, 2, 8), v_cache=torch.randn(4, 4, 2, 8),
                block_tables=torch.tensor([[0, 1], [2, 3]]), context_lens=torch.tensor([5, 8]), scale=0.35)
    args.update(change)
    return args


@pytest.mark.parametrize("change, error, message", [
    (dict(block_tables=torch.tensor([[0, 4], [2, 3]])), IndexError,
     r"block_tables\[0, 1\] = 4 is outside the cache's 4 blocks"),
    (dict(block_tables=torch.tensor([[0, 1], [-1, 3]])), IndexError, r"block_tables\[1, 0\] = -1"),
    (dict(context_lens=torch.tensor([5, 9])), IndexError, r"context_lens\[1\] = 9 is outside 1..8"),
    (dict(context_lens=torch.tensor([0, 8])), IndexError, r"context_lens\[0\] = 0"),
    (dict(q=torch.randn(2, 4, 8, dtype=torch.float16)), ValueError, "q must be float32 or bfloat16, got Half"),
    (dict(k_cache=torch.randn(4, 4, 2, 8, dtype=torch.float64)), ValueError, "k_cache must be float32 or bfloat16"),
    (dict(v_cache=torch.randn(4, 4, 2, 8, dtype=torch.bfloat16)), ValueError, "the same for both caches"),
    (dict(block_tables=torch.tensor([[0.0, 1.0], [2.0, 3.0]])), ValueError, "block_tables must hold integers"),
    (dict(q=torch.randn(3, 4, 8)), ValueError, "one row per query"),
    (dict(q=torch.randn(2, 3, 8)), ValueError, "multiple of the caches' 2 kv heads"),
    (dict(v_cache=torch.randn(4, 4, 2, 8)[:, :, :, :4]), ValueError, "contiguous"),
])
def test_paged_decode_attention_refuses_bad_arguments(change, error, message):
    """A bad block id is an error, not an out-of-bounds read; so is a wrong dtype or shape."""
    with pytest.raises(error, match=message):
        cpu_kernels.paged_decode_attention(**_decode_args(**change))


@pytest.mark.parametrize("call, error, message", [
    (lambda: cpu_kernels.write_kv(torch.randn(2, 2, 8), torch.randn(2, 2, 8), torch.tensor([3, 32]),
                                  torch.zeros(8, 4, 2, 8), torch.zeros(8, 4, 2, 8)),
     IndexError, r"slots\[1\] = 32 is outside the 32 cache slots"),
    (lambda: cpu_kernels.write_kv(torch.randn(2, 2, 8), torch.randn(2, 2, 8), torch.tensor([3, 4]),
                                  torch.zeros(8, 4, 2, 8, dtype=torch.float16), torch.zeros(8, 4, 2, 8)),
     ValueError, "k_cache and v_cache must be contiguous Float CPU tensors of one shape, as k is"),
    (lambda: cpu_kernels.rotary_(torch.randn(2, 4, 8), torch.randn(2, 2, 8), torch.tensor([0, 16]),
                                 torch.randn(16, 8), torch.randn(16, 8)),
     IndexError, r"positions\[1\] = 16 is outside the 16 rotary table positions"),
    (lambda: cpu_kernels.rotary_(torch.randn(2, 8, 4).transpose(1, 2), torch.randn(2, 2, 8), torch.tensor([0, 1]),
                                 torch.randn(16, 8), torch.randn(16, 8)),
     ValueError, "contiguous heads"),
    (lambda: cpu_kernels.rms_norm(torch.randn(3, 8), torch.randn(7), 1e-6), ValueError,
     r"weight must be contiguous \[8\]"),
    (lambda: cpu_kernels.rms_norm(torch.randn(3, 8, dtype=torch.float64), torch.randn(8), 1e-6), ValueError, "float32"),
    (lambda: cpu_kernels.silu_mul(torch.randn(3, 7)), ValueError, r"\[M, 2I\]"),
    (lambda: cpu_kernels.rms_norm(torch.randn(3, 8).bfloat16(), torch.randn(8), 1e-6), ValueError,
     "weight must be BFloat16 as the input is, got Float"),
    (lambda: cpu_kernels.write_kv(torch.randn(2, 2, 8).bfloat16(), torch.randn(2, 2, 8).bfloat16(),
                                  torch.tensor([3, 4]), torch.zeros(4, 16), torch.zeros(4, 16)), ValueError,
     "k_cache and v_cache must be contiguous BFloat16 CPU tensors"),
    (lambda: cpu_kernels.argmax_rows(torch.ones(3, 4, dtype=torch.int32)), ValueError, "x must be float32"),
    (lambda: cpu_kernels.argmax_rows(torch.ones(3)), ValueError, "x must be 2-D"),
    (lambda: cpu_kernels.ops().linear_packed(torch.randn(2, 8), cpu_kernels.PackedWeight(torch.randn(4, 8)).data, 17),
     ValueError, "out_features 17 does not fit"),
    (lambda: cpu_kernels.ops().pack_weight(torch.randn(4, 8), torch.empty(10)), ValueError,
     "contiguous 128-element buffer"),
    (lambda: cpu_kernels.ops().pack_weight(torch.randn(40, 7).to(torch.bfloat16),
                                           torch.empty(10, dtype=torch.bfloat16)),
     ValueError, "contiguous 512-element buffer"),  # 2 panels x 4 k pairs x 64
    (lambda: cpu_kernels.ops().pack_weight(torch.randn(4, 8), torch.empty(128, dtype=torch.bfloat16)),
     ValueError, "out must be a 1-D CPU tensor of the weight's dtype"),
    (lambda: cpu_kernels.ops().linear_packed(torch.randn(2, 6).to(torch.bfloat16),
                                             cpu_kernels.PackedWeight(torch.randn(4, 7).to(torch.bfloat16)).data, 4),
     ValueError, r"input \[\.\.\., 7 to 8\]"),  # K odd or even: the padded pair matches both
    (lambda: cpu_kernels.ops().linear_packed(torch.randn(2, 8).to(torch.bfloat16),
                                             cpu_kernels.PackedWeight(torch.randn(4, 8).to(torch.bfloat16)).data, 33),
     ValueError, "out_features 33 does not fit a weight packed in 1 panels of 32"),
    (lambda: cpu_kernels.ops().linear_packed(torch.randn(2, 8),
                                             cpu_kernels.PackedWeight(torch.randn(4, 8).to(torch.bfloat16)).data, 4),
     ValueError, "x must be 2-D bfloat16 for a bf16 weight"),
    (lambda: cpu_kernels.ops().linear_packed(torch.randn(2, 8).to(torch.bfloat16),
                                             cpu_kernels.PackedWeight(torch.randn(4, 8).to(torch.bfloat16)).data, 4,
                                             torch.ones(4)),
     ValueError, "scales are for int8 weights only"),
    (lambda: cpu_kernels.ops().linear_packed(torch.randn(2, 8, dtype=torch.float64),
                                             cpu_kernels.PackedWeight(torch.randn(4, 8).to(torch.bfloat16)).data, 4,
                                             units=False),
     ValueError, "x must be 2-D float32 or bfloat16 for a bf16 weight on AVX2"),
    (lambda: cpu_kernels.ops().linear_packed(torch.randn(2, 8),
                                             cpu_kernels.PackedWeight(torch.ones(4, 8, dtype=torch.int8),
                                                                      scale=torch.ones(4)).data, 4),
     ValueError, "an int8 weight needs its scales"),
    (lambda: cpu_kernels.ops().linear_packed(torch.randn(2, 8),
                                             cpu_kernels.PackedWeight(torch.ones(4, 8, dtype=torch.int8),
                                                                      scale=torch.ones(4)).data, 4, torch.ones(3)),
     ValueError, r"scale must be contiguous float32 \[4\]"),
    (lambda: cpu_kernels.ops().linear_packed(torch.randn(2, 8).to(torch.bfloat16),
                                             cpu_kernels.PackedWeight(torch.ones(4, 8, dtype=torch.int8),
                                                                      scale=torch.ones(4)).data, 4, torch.ones(4)),
     ValueError, "x must be 2-D float32 for an int8 weight"),
    (lambda: cpu_kernels.linear_int8(torch.randn(2, 8, dtype=torch.bfloat16), torch.ones(4, 8, dtype=torch.int8),
                                     torch.ones(4)), ValueError, "x must be float32, got BFloat16"),
    (lambda: cpu_kernels.linear_int8(torch.randn(2, 8), torch.ones(4, 8), torch.ones(4)),
     ValueError, "q must be a contiguous 2-D int8"),
    (lambda: cpu_kernels.linear_int8(torch.randn(2, 8), torch.ones(8, 4, dtype=torch.int8).t(), torch.ones(4)),
     ValueError, "q must be a contiguous 2-D int8"),
    (lambda: cpu_kernels.linear_int8(torch.randn(2, 9), torch.ones(4, 8, dtype=torch.int8), torch.ones(4)),
     ValueError, r"int8 linear takes x \[M, 8\]"),
    (lambda: cpu_kernels.linear_int8(torch.randn(2, 8), torch.ones(4, 8, dtype=torch.int8), torch.ones(3)),
     ValueError, r"scale must be contiguous \[4\]"),
    (lambda: cpu_kernels.linear_int8(torch.randn(2, 8), torch.ones(4, 8, dtype=torch.int8), torch.ones(4).half()),
     ValueError, "scale must be float32"),
    (lambda: cpu_kernels.linear_bf16w(torch.randn(2, 8, dtype=torch.bfloat16), torch.ones(4, 8, dtype=torch.bfloat16)),
     ValueError, "x must be float32, got BFloat16"),
    (lambda: cpu_kernels.linear_bf16w(torch.randn(2, 8), torch.ones(4, 8)),
     ValueError, "w must be a contiguous 2-D bf16"),
    (lambda: cpu_kernels.linear_bf16w(torch.randn(2, 8), torch.ones(8, 4, dtype=torch.bfloat16).t()),
     ValueError, "w must be a contiguous 2-D bf16"),
    (lambda: cpu_kernels.linear_bf16w(torch.randn(2, 9), torch.ones(4, 8, dtype=torch.bfloat16)),
     ValueError, r"bf16 linear takes x \[M, 8\]"),
])
def test_operators_check_their_arguments(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_checks_survive_python_O():
    """The checks are TORCH_CHECKs in C++, not asserts: `python -O` keeps them."""
    code = ("import torch; from appliance.engine import cpu_kernels as k\n"
            "try:\n"
            "    k.paged_decode_attention(torch.randn(1, 2, 8), torch.randn(2, 4, 1, 8), torch.randn(2, 4, 1, 8),\n"
            "                             torch.tensor([[7]]), torch.tensor([3]), 1.0)\n"
            "except IndexError as e:\n"
            "    print('IndexError', e)\n")
    out = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("IndexError block_tables[0, 0] = 7"), out.stdout + out.stderr


def test_operators_are_registered_with_torch():
    names = {"pack_weight", "linear_packed", "paged_decode_attention", "rms_norm", "rotary_", "write_kv",
             "silu_mul", "argmax_rows", "linear_int8", "linear_bf16w"}
    assert all(isinstance(getattr(torch.ops.appliance, n), torch._ops.OpOverloadPacket) for n in names)
    x = torch.randn(4, 9)
    assert torch.equal(torch.ops.appliance.argmax_rows(x), x.argmax(-1))
