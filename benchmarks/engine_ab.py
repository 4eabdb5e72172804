"""Engine variants on engine_throughput.py's workload, interleaved in one process.

    .venv/bin/python benchmarks/engine_ab.py --threads 2 --rounds 5 [--model-dir DIR]

Variants (each its own engine on the same weights, built once; engine.cpu_kernels is per engine):
  ours        our CPU kernels (the default for fp32 on CPU)
  torch-gemm  our kernels but torch's GEMM (linear weights left unpacked: F.linear, MKL/oneDNN)
  torch       engine.cpu_kernels=false
Each round runs engine_throughput.py's 32 requests (prefix cache off, as there) on every variant, the
order rotated per round; medians over rounds, so a neighbour's load on a shared host moves all alike.
"""
import argparse
import contextlib
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from engine_throughput import bench_model, generate_tok_s, make_requests


def build(path, variant):
    from appliance.engine import model_runner
    from appliance.engine.config import EngineConfig
    from appliance.engine.llm_engine import LLMEngine

    cfg = EngineConfig(kv_cache_memory_bytes=512 * 2 ** 20, max_num_seqs=64, max_num_batched_tokens=2048,
                       enable_prefix_caching=False, cpu_kernels=variant != "torch")
    keep_unpacked = contextlib.nullcontext()
    if variant == "torch-gemm":
        from unittest import mock
        keep_unpacked = mock.patch.object(model_runner, "pack_for_cpu", lambda *args: None)
    with keep_unpacked:
        return LLMEngine(path, cfg)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--variants", default="ours,torch-gemm,torch")
    ap.add_argument("--model-dir", default=None, help="reuse a bench model built by engine_throughput.py")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()}")
    variants = args.variants.split(",")
    with bench_model(args.model_dir) as path:
        engines = {v: build(path, v) for v in variants}
    for engine in engines.values():
        generate_tok_s(engine, make_requests(4, seed=1000))  # warm-up
    requests = make_requests(args.num_requests)
    results = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:
            results[v].append(generate_tok_s(engines[v], requests)[0])
            print(f"round {r} {v:10s} {results[v][-1]:7.1f} tok/s", flush=True)
    base = statistics.median(results[variants[0]])
    print(f"\n{'variant':10s} {'median tok/s':>12s} {'vs ' + variants[0]:>10s}")
    for v in variants:
        m = statistics.median(results[v])
        print(f"{v:10s} {m:12.1f} {m / base:9.2f}x")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
