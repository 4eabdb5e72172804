"""One linear layer at a 7B shape (4096 in, 11008 out): ms per call in bf16, int8 and int4 weights.

    .venv/bin/python benchmarks/int4_linear.py --threads 2 [--rows 1 2 3 4 8 32 128] [--group-size 128]

bf16: torch's F.linear on the bf16 weight. int8: the host's int8 plan (kernel_plan.int8_plan, our
kernels on where they load). int4: torch's int4 kernel, our GEMV and our GEMM (on VPDPBUSD, or on AVX2
where torch packs for AVX2, e.g. under ATEN_CPU_CAPABILITY=avx2; nan where the host's plan has none: no
AVX512-VNNI or AVX2 packing, AMX, or our kernels not loaded) and the dequantised tiles (by our kernel, nan
where it does not load, and by torch ops), each timed at every row count (the plan runs our GEMV up to
kernel_plan.INT4_GEMV_ROWS rows, or INT4_GEMV_ROWS_AVX2 on AVX2, before our GEMM; elsewhere torch's kernel
up to INT4_KERNEL_ROWS rows before our tiles, or INT4_KERNEL_ROWS_TORCH_TILES before torch's): where the
columns cross is where those constants belong.
Each weight is held in copies used in turn, together past four times the L3 (an int4 weight is 24 MB),
so that every call reads its weight from memory, as a decode step does; the last columns are our GEMV's
weight GB/s at each row count and the host's read bandwidth, measured in the same process
(roofline.memory_bandwidth). The best of `--repeats` passes over the copies after one warm-up.
"""
import argparse
import copy
import dataclasses
import math
import time

import torch
import torch.nn.functional as F

from appliance.engine import cpu_kernels
from appliance.engine.host import Host
from appliance.engine.int4 import Int4Weight
from appliance.engine.int8 import Int8Weight
from appliance.engine.kernel_plan import int4_plan, int8_plan
from roofline import memory_bandwidth

IN_FEATURES, OUT_FEATURES = 4096, 11008
FROM_MEMORY_BYTES = 128 << 20  # four times a 32 MB L3: the copies of a weight together


def best_ms(fn, calls: int, repeats: int) -> float:
    """ms a call of `fn`, which makes `calls` calls a pass: the best pass (on a shared host the median
    mostly measures the neighbours)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times) / calls


def copies(weight, nbytes: int) -> list:
    """`weight` (a tensor or an Int4Weight) and clones of its tensors, together at least FROM_MEMORY_BYTES."""
    out = [weight]
    for _ in range(math.ceil(FROM_MEMORY_BYTES / nbytes) - 1):
        if isinstance(weight, torch.Tensor):
            out.append(weight.clone())
            continue
        clone = copy.copy(weight)
        clone.__dict__.update({k: v.clone() for k, v in vars(weight).items() if isinstance(v, torch.Tensor)})
        out.append(clone)
    return out


def with_plan(weights: list, plan) -> list:
    """The same int4 bytes multiplied as `plan` says."""
    out = [copy.copy(w) for w in weights]
    for w in out:
        w.plan = plan
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 8, 32, 128])
    parser.add_argument("--group-size", type=int, default=128, choices=(32, 64, 128))
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    host = Host.read()
    weight = torch.randn(OUT_FEATURES, IN_FEATURES) * 0.02
    bf16 = weight.bfloat16()
    bf16s = copies(bf16, bf16.nbytes)
    w8 = [Int8Weight(weight, int8_plan(host, cpu_kernels.available()))]
    w8 += [Int8Weight(weight, w8[0].plan) for _ in range(math.ceil(FROM_MEMORY_BYTES / w8[0].nbytes) - 1)]
    ours = cpu_kernels.available()
    plan4 = int4_plan(host, args.group_size, ours)
    w4 = Int4Weight(weight, plan4)
    w4s = copies(w4, w4.nbytes)
    gemv = plan4.gemv_rows > 0  # the plan's GEMV: VPDPBUSD where it has vnni, else AVX2
    w4_kernel = with_plan(w4s, dataclasses.replace(plan4, gemv_rows=0, kernel_rows=max(args.rows)))
    w4_gemv = with_plan(w4s, dataclasses.replace(plan4, gemv_rows=max(args.rows)))
    w4_gemm = with_plan(w4s, dataclasses.replace(plan4, gemv_rows=0, kernel_rows=0))
    w4_tiles = with_plan(w4s, dataclasses.replace(plan4, gemv_rows=0, kernel_rows=0, gemm=False))
    w4_torch_tiles = with_plan(w4s, dataclasses.replace(plan4, gemv_rows=0, kernel_rows=0, ours=False, gemm=False))
    print(f"{OUT_FEATURES}x{IN_FEATURES}, {args.threads} threads, int4 groups of {args.group_size} in "
          f"{str(plan4.dtype).replace('torch.', '')} ({len(w4s)} copies of {w4.nbytes / 1e6:.1f} MB; the plan: "
          f"our {'vpdpbusd' if plan4.vnni else 'avx2'} gemv rows 1-{plan4.gemv_rows}, torch's int4 kernel rows "
          f"1-{plan4.kernel_rows}, then {'our gemm' if plan4.gemm else 'tiles'})")
    print(f"{'rows':>5} {'bf16 ms':>9} {'int8 ms':>9} {'int4 kernel ms':>15} {'int4 gemv ms':>13} "
          f"{'int4 gemm ms':>13} {'int4 tiles ms':>14} {'int4 torch tiles ms':>20} {'gemv GB/s':>10} {'read GB/s':>10}")
    nan = float("nan")
    for rows in args.rows:
        x = torch.randn(rows, IN_FEATURES).bfloat16()

        def timed(weights, run=True):
            return best_ms(lambda: [w.linear(x) for w in weights], len(weights), args.repeats) if run else nan

        times = [best_ms(lambda: [F.linear(x, w) for w in bf16s], len(bf16s), args.repeats), timed(w8),
                 timed(w4_kernel), timed(w4_gemv, gemv), timed(w4_gemm, plan4.gemm), timed(w4_tiles, ours),
                 timed(w4_torch_tiles)]
        read = memory_bandwidth(gib=0.5, seconds=0.5)  # beside each row's timings: the host is shared
        print(f"{rows:>5} " + " ".join(f"{t:>{width}.2f}" for t, width in zip(times, (9, 9, 15, 13, 13, 14, 20)))
              + f" {w4.nbytes / times[3] / 1e6:>10.1f} {read / 1e9:>10.1f}")


if __name__ == "__main__":
    main()
