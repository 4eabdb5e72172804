"""Before/after A/B of the prefix cache's block hashing, interleaved in one process.

    .venv/bin/python benchmarks/prefix_hashing_ab.py --threads 1 --rounds 5

engine_throughput.py's workload and bench model (32 requests, prompts 32-256, outputs 16-128) with the
prefix cache on (the engine's default; engine_throughput.py turns it off). Two engines on the same
weights: "before" hashes every full block of every scheduled sequence on every step (the former
`cache_full_blocks`, kept below), "after" hashes each block once, when it fills (the engine's). Each round
runs a fresh request set (seed = round, so no round hits another's cached blocks) on both engines, in
alternating order; the medians over rounds are robust to a neighbour's load on a shared host. First it
prints the cost of one call per decode step for a single sequence of 256, 1024 and 4096 tokens.
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from engine_throughput import bench_model, generate_tok_s, make_requests


def cache_full_blocks_rehash_all(self, seq) -> None:
    """The former BlockManager.cache_full_blocks: sha256 over the whole sequence, every step."""
    if not self.enable_prefix_caching:
        return
    hashes = self.block_hashes(seq, seq.num_computed_tokens)
    for block_id, h in zip(seq.block_table, hashes):
        block = self.blocks[block_id]
        if block.hash is None:
            block.hash = h
            self.cached.setdefault(h, block_id)


class Timed:
    """Wraps a block manager's cache_full_blocks and sums its time."""

    def __init__(self, fn):
        self.fn, self.seconds = fn, 0.0

    def __call__(self, seq):
        t = time.perf_counter()
        self.fn(seq)
        self.seconds += time.perf_counter() - t


def per_step_cost(lengths=(256, 1024, 4096), steps=64):
    """Time of one cache_full_blocks call per decode step for one sequence of each context length."""
    from appliance.engine.block_manager import BlockManager
    from appliance.engine.sampling_params import SamplingParams
    from appliance.engine.sequence import Sequence

    for length in lengths:
        best = {}
        for name in ("before", "after") * 3:
            bm = BlockManager(length // 16 + steps, 16)
            seq = Sequence("a", list(range(length)), SamplingParams(), 0)
            bm.allocate(seq, length)
            seq.num_computed_tokens = length
            fn = cache_full_blocks_rehash_all.__get__(bm) if name == "before" else bm.cache_full_blocks
            fn(seq)
            times = []
            for _ in range(steps):
                seq.append_token(7)
                bm.allocate(seq, seq.num_tokens)
                seq.num_computed_tokens = seq.num_tokens
                t = time.perf_counter()
                fn(seq)
                times.append(time.perf_counter() - t)
            best[name] = min(best.get(name, 1.0), statistics.median(times))
        print(f"one sequence, context {length}: cache_full_blocks per decode step {best['before'] * 1e6:.0f} us "
              f"before, {best['after'] * 1e6:.1f} us after")


def run(engine, requests):
    timer = engine.block_manager.cache_full_blocks
    timer.seconds = 0.0
    tok_s, produced = generate_tok_s(engine, requests)
    return tok_s, timer.seconds, produced


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--model-dir", default=None, help="reuse a bench model built by engine_throughput.py")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from appliance.engine.config import EngineConfig
    from appliance.engine.llm_engine import LLMEngine

    print(f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()}")
    per_step_cost()
    cfg = EngineConfig(kv_cache_memory_bytes=512 * 2 ** 20, max_num_seqs=64, max_num_batched_tokens=2048,
                       enable_prefix_caching=True)
    with bench_model(args.model_dir) as path:
        engines = {"before": LLMEngine(path, cfg), "after": LLMEngine(path, cfg)}
    for name, engine in engines.items():
        bm = engine.block_manager
        fn = cache_full_blocks_rehash_all.__get__(bm) if name == "before" else bm.cache_full_blocks
        bm.cache_full_blocks = Timed(fn)
        run(engine, make_requests(4, seed=1000))  # warm-up
    results = {name: [] for name in engines}
    for r in range(args.rounds):
        requests = make_requests(args.num_requests, seed=r)
        order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
        for name in order:
            tok_s, hash_s, produced = run(engines[name], requests)
            results[name].append((tok_s, hash_s))
            print(f"round {r} {name:6s}: {tok_s:7.1f} tok/s, cache_full_blocks {hash_s * 1e3:7.1f} ms "
                  f"({produced} tokens)")
    print(f"\n{'':8s} {'median tok/s':>12s} {'median hashing ms':>18s}")
    for name, rows in results.items():
        print(f"{name:8s} {statistics.median(t for t, _ in rows):12.1f} "
              f"{statistics.median(h for _, h in rows) * 1e3:18.1f}")
    ratios = [a[0] / b[0] for a, b in zip(results["after"], results["before"])]
    print(f"after / before, per round: {', '.join(f'{x:.3f}' for x in ratios)}; median {statistics.median(ratios):.3f}")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
