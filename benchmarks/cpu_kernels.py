"""Our CPU kernels (appliance/engine/csrc/) against the torch code they replace.

    .venv/bin/python benchmarks/cpu_kernels.py --threads 2

GEMMs: the bench model's layer shapes (benchmarks/engine_throughput.py) and its LM head, with eight
copies of each weight used in turn so that they come from memory, as in a decode step; torch's
F.linear (MKL) vs our packed GEMM, median of 7. Then the bf16 GEMMs at a 7B Llama's shapes (each weight
32-260 MB, so from memory), from one decode row to an image prompt's 610: torch's F.linear (oneDNN;
emulated bf16 on CPUs without bf16 units) vs our packed AVX2 GEMM (weights widened to fp32, run on
every CPU: what CPUs without bf16 units run) and, on CPUs with AVX512-BF16, our packed VDPBF16PS GEMM
(what they run); our packed AVX2 int8 GEMM (VPMADDUBSW, run on every CPU: what CPUs without AVX512-VNNI
run) on the same weights quantised, its GFLOP/s and weight GB/s; with AVX512-VNNI too, our packed int8
GEMM (VPDPBUSD) as a fraction of the VDPBF16PS GEMM's time. Decode attention:
32 sequences of 150-300 tokens in scattered blocks (8 KV heads x 64), torch's gather + SDPA (the torch
backend) vs our in-place kernel;
and ours at a 7B shape (bf16 caches, 32 heads x 128) for 1, 2 and 8 sequences, each call on blocks the
last calls did not read (a 1 GB pool), as a decode step meets them.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from appliance.engine import cpu_kernels, hugepages
from appliance.engine.host import Host
from appliance.engine.int8 import Int8Plan, Int8Weight


def median_s(fn, repeats: int = 7) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def gemm_rows(rows_list, copies: int = 8):
    shapes = {"qkv 1536x512": (1536, 512), "o 512x512": (512, 512), "gate_up 2816x512": (2816, 512),
              "down 512x1408": (512, 1408), "LM head 32000x512": (32000, 512)}
    for name, (n, k) in shapes.items():
        count = 2 if n == 32000 else copies
        weights = [torch.randn(n, k) for _ in range(count)]
        packed = [cpu_kernels.PackedWeight(w) for w in weights]
        for rows in rows_list:
            if n == 32000 and rows > 256:
                continue  # the LM head sees one row per sampled sequence
            x = torch.randn(rows, k)
            ours = median_s(lambda: [cpu_kernels.linear(x, p) for p in packed])
            mkl = median_s(lambda: [F.linear(x, w) for w in weights])
            flops = 2 * rows * n * k * count
            yield name, rows, flops / mkl / 1e9, flops / ours / 1e9, mkl / ours


BF16_SHAPES = {"qkv 12288x4096": (12288, 4096), "o 4096x4096": (4096, 4096), "gate_up 22016x4096": (22016, 4096),
               "down 4096x11008": (4096, 11008), "LM head 32064x4096": (32064, 4096)}


def bf16_gemm_rows(rows_list, units: bool, with_int8: bool, shapes=BF16_SHAPES):
    """Per shape and row count: GFLOP/s of torch, our AVX2 GEMM and (`units`) our VDPBF16PS GEMM, the AVX2
    GEMM's weight GB/s, our AVX2 int8 GEMM's GFLOP/s and weight GB/s (the same weights quantised), and
    (`with_int8`) the VPDPBUSD int8 GEMM's time as a fraction of the VDPBF16PS one's."""
    nan = float("nan")
    for name, (n, k) in shapes.items():
        weight = torch.randn(n, k).to(torch.bfloat16)
        fma = cpu_kernels.PackedWeight(weight, bf16_units=False)
        packed = cpu_kernels.PackedWeight(weight) if units else None
        quantized = Int8Weight(weight, Int8Plan(0, torch.bfloat16, packed=True, vnni=True)) \
            if with_int8 else None
        int8_avx2 = Int8Weight(weight, Int8Plan(0, torch.float32, packed=True))  # runs on every CPU
        for rows in rows_list:
            x = torch.randn(rows, k).to(torch.bfloat16)
            torch_s = median_s(lambda: F.linear(x, weight))
            fma_s = median_s(lambda: cpu_kernels.linear(x, fma))
            units_s = median_s(lambda: cpu_kernels.linear(x, packed)) if units else nan
            x32 = x.float()  # the int8 GEMM's input
            int8 = median_s(lambda: quantized.linear(x32)) if with_int8 else nan
            int8_avx2_s = median_s(lambda: int8_avx2.linear(x32))
            flops = 2 * rows * n * k
            yield (name, rows, flops / torch_s / 1e9, flops / fma_s / 1e9, flops / units_s / 1e9,
                   n * k * 2 / fma_s / 1e9, flops / int8_avx2_s / 1e9, n * k / int8_avx2_s / 1e9, int8 / units_s)


def kv_pool(shape, dtype) -> torch.Tensor:
    """Random K or V blocks in memory laid out as the engine's pool is (huge pages where the host grants them)."""
    return hugepages.empty(shape, dtype).copy_(torch.randn(shape))


def attention_row():
    torch.manual_seed(0)
    blocks, block_size, kv_heads, head_dim, batch = 1024, 16, 8, 64, 32
    k_cache = kv_pool((blocks, block_size, kv_heads, head_dim), torch.float32)
    v_cache = kv_pool((blocks, block_size, kv_heads, head_dim), torch.float32)
    lens = torch.randint(150, 300, (batch,))
    width = -(-int(lens.max()) // block_size)
    tables = torch.randperm(blocks)[: batch * width].view(batch, width)
    q = torch.randn(batch, kv_heads, head_dim)

    def gather_sdpa():
        length = width * block_size
        k = k_cache.index_select(0, tables.flatten()).view(batch, length, kv_heads, head_dim).transpose(1, 2)
        v = v_cache.index_select(0, tables.flatten()).view(batch, length, kv_heads, head_dim).transpose(1, 2)
        mask = torch.arange(length) < lens[:, None]
        return F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=mask[:, None, None, :])

    torch_s = median_s(gather_sdpa, 15)
    ours_s = median_s(lambda: cpu_kernels.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.125), 15)
    kv_bytes = int(lens.sum()) * kv_heads * head_dim * 4 * 2
    return torch_s, ours_s, kv_bytes


def attention_7b_rows():
    torch.manual_seed(0)
    heads, head_dim, block_size, blocks = 32, 128, 16, 4096
    k_cache = kv_pool((blocks, block_size, heads, head_dim), torch.bfloat16)
    v_cache = kv_pool((blocks, block_size, heads, head_dim), torch.bfloat16)
    for batch, length in [(1, 600), (1, 2131), (2, 2131), (8, 600)]:
        width = -(-length // block_size)
        perm = torch.randperm(blocks)
        sets = blocks // (batch * width)
        tables = [perm[i * batch * width:(i + 1) * batch * width].view(batch, width) for i in range(sets)]
        lens = torch.full((batch,), length)
        q = torch.randn(batch, heads, head_dim).to(torch.bfloat16)
        calls = iter(range(10 ** 9))
        seconds = median_s(lambda: cpu_kernels.paged_decode_attention(q, k_cache, v_cache,
                                                                      tables[next(calls) % sets], lens, 0.088), 15)
        yield batch, length, seconds, batch * length * heads * head_dim * 2 * 2 / seconds / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 256, 2048])
    ap.add_argument("--bf16-rows", type=int, nargs="+", default=[1, 2, 8, 16, 64, 610])
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if not cpu_kernels.available():
        raise SystemExit(f"CPU kernels unavailable: {cpu_kernels.unavailable_reason()}")
    print(f"torch threads {torch.get_num_threads()}\n")
    print(f"{'GEMM':20s} {'rows':>5s} {'MKL GFLOP/s':>12s} {'ours GFLOP/s':>13s} {'speed-up':>9s}")
    for name, rows, mkl, ours, speedup in gemm_rows(args.rows):
        print(f"{name:20s} {rows:5d} {mkl:12.0f} {ours:13.0f} {speedup:8.2f}x")
    flags = Host.read().cpu_flags
    units = "avx512_bf16" in flags
    with_int8 = units and "avx512_vnni" in flags
    print(f"\n{'bf16 GEMM, 7B':20s} {'rows':>5s} {'torch GFLOP/s':>14s} {'ours avx2 fma':>14s} {'ours vdpbf16ps':>15s} "
          f"{'avx2 GB/s':>10s} {'int8 avx2 GFLOP/s':>18s} {'int8 avx2 GB/s':>15s} {'int8 / vdpbf16ps time':>22s}")
    for (name, rows, torch_gf, fma_gf, units_gf, gbs, int8_gf, int8_gbs,
         int8) in bf16_gemm_rows(args.bf16_rows, units, with_int8):
        print(f"{name:20s} {rows:5d} {torch_gf:14.0f} {fma_gf:14.0f} {units_gf:15.0f} {gbs:10.1f} {int8_gf:18.0f} "
              f"{int8_gbs:15.1f} {int8:22.2f}")
    torch_s, ours_s, kv_bytes = attention_row()
    print(f"\ndecode attention, 32 sequences ({kv_bytes / 1e6:.0f} MB of K/V): gather + SDPA "
          f"{torch_s * 1e3:.2f} ms, ours {ours_s * 1e3:.2f} ms ({torch_s / ours_s:.1f}x, "
          f"{kv_bytes / ours_s / 1e9:.1f} GB/s)")
    for batch, length, seconds, gbs in attention_7b_rows():
        print(f"decode attention, 7B shape, {batch} x {length} tokens: {seconds * 1e3:.2f} ms ({gbs:.1f} GB/s)")


if __name__ == "__main__":
    main()
