"""One linear layer at a 7B shape (4096 in, 11008 out): ms per call in bf16, int8 and int4 weights.

    .venv/bin/python benchmarks/int4_linear.py --threads 2 [--rows 1 8 32 128] [--group-size 128]

bf16: torch's F.linear on the bf16 weight. int8: the host's int8 plan (kernel_plan.int8_plan, our
kernels on where they load). int4: torch's int4 kernel, our VPDPBUSD GEMM (nan where the host's plan
has none: no AVX512-VNNI, AMX, or our kernels not loaded) and the dequantised tiles (by our kernel, nan
where it does not load, and by torch ops), each timed at every row count (the plan runs the kernel up
to kernel_plan.INT4_KERNEL_ROWS_VNNI rows before our GEMM, INT4_KERNEL_ROWS before our tiles, or
INT4_KERNEL_ROWS_TORCH_TILES before torch's): where the columns cross is where those constants belong.
Median of `--repeats` calls after one warm-up.
"""
import argparse
import dataclasses
import statistics
import time

import torch
import torch.nn.functional as F

from appliance.engine import cpu_kernels
from appliance.engine.host import Host
from appliance.engine.int4 import Int4Weight
from appliance.engine.int8 import Int8Weight
from appliance.engine.kernel_plan import int4_plan, int8_plan

IN_FEATURES, OUT_FEATURES = 4096, 11008


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--group-size", type=int, default=128, choices=(32, 64, 128))
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    host = Host.read()
    weight = torch.randn(OUT_FEATURES, IN_FEATURES) * 0.02
    bf16 = weight.bfloat16()
    w8 = Int8Weight(weight, int8_plan(host, cpu_kernels.available()))
    ours = cpu_kernels.available()
    plan4 = int4_plan(host, args.group_size, ours)
    w4_kernel = Int4Weight(weight, dataclasses.replace(plan4, kernel_rows=max(args.rows)))
    w4_vnni = Int4Weight(weight, dataclasses.replace(plan4, kernel_rows=0))
    w4_tiles = Int4Weight(weight, dataclasses.replace(plan4, kernel_rows=0, vnni=False))
    w4_torch_tiles = Int4Weight(weight, dataclasses.replace(plan4, kernel_rows=0, ours=False, vnni=False))
    print(f"{OUT_FEATURES}x{IN_FEATURES}, {args.threads} threads, int4 groups of {args.group_size} in "
          f"{str(plan4.dtype).replace('torch.', '')} (the plan's int4 kernel rows: 1-{plan4.kernel_rows})")
    print(f"{'rows':>5} {'bf16 ms':>9} {'int8 ms':>9} {'int4 kernel ms':>15} {'int4 vnni ms':>13} "
          f"{'int4 tiles ms':>14} {'int4 torch tiles ms':>20}")
    for rows in args.rows:
        x = torch.randn(rows, IN_FEATURES).bfloat16()
        times = [median_ms(lambda: F.linear(x, bf16), args.repeats),
                 median_ms(lambda: w8.linear(x), args.repeats),
                 median_ms(lambda: w4_kernel.linear(x), args.repeats),
                 median_ms(lambda: w4_vnni.linear(x), args.repeats) if plan4.vnni else float("nan"),
                 median_ms(lambda: w4_tiles.linear(x), args.repeats) if ours else float("nan"),
                 median_ms(lambda: w4_torch_tiles.linear(x), args.repeats)]
        print(f"{rows:>5} {times[0]:>9.1f} {times[1]:>9.1f} {times[2]:>15.1f} {times[3]:>13.1f} {times[4]:>14.1f} "
              f"{times[5]:>20.1f}")


if __name__ == "__main__":
    main()
