"""This host's ceilings, measured, and what a Llama-shaped model needs per token, counted: the engine
benchmark divides its tokens/s by them (batched decode against the GEMM roofline of the dtype, one
stream against the memory roofline).

    .venv/bin/python benchmarks/roofline.py --threads 2     # the ceilings alone
"""
import argparse
import json
import os
import time

import torch
import torch.nn.functional as F

BYTES_PER_WEIGHT = {"float32": 4.0, "bfloat16": 2.0, "int8": 1.0}


def gemm_flops(dtype: torch.dtype, rows: int = 512, size: int = 2048, seconds: float = 1.0) -> float:
    """FLOP/s of `F.linear` (x @ W^T, the engine's layout: torch's bf16 `a @ b` takes a far slower path
    on some CPUs) of `rows` rows against a square weight in `dtype`, best of runs for about `seconds`."""
    x, w = torch.randn(rows, size).to(dtype), torch.randn(size, size).to(dtype)
    F.linear(x, w)  # warm-up: thread pool, packing buffers
    best, end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        F.linear(x, w)
        best = min(best, time.perf_counter() - start)
    return 2 * rows * size * size / best


def memory_bandwidth(gib: float = 1.0, seconds: float = 1.0) -> float:
    """Bytes/s read by a sum over `gib` of fp32 (far beyond any cache), best of repeated runs: what a
    decode step that streams every weight once can hope for."""
    x = torch.ones(int(gib * 2 ** 30 / 4))
    x.sum()
    best, end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - start)
    return x.numel() * 4 / best


def linear_weights(model_dir: str) -> int:
    """Weights a token multiplies in a Llama-shaped checkpoint: every layer's projections and the LM head
    (the embedding is a row lookup, not a matmul)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    cfg = cfg.get("text_config", cfg)
    h, inter, heads = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim") or h // heads
    attention = h * head_dim * (2 * heads + 2 * kv_heads)  # q and o, k and v
    return cfg["num_hidden_layers"] * (attention + 3 * h * inter) + h * cfg["vocab_size"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch threads {torch.get_num_threads()}")
    for dtype in (torch.float32, torch.bfloat16):
        print(f"GEMM 512x2048x2048 {str(dtype).replace('torch.', '')}: {gemm_flops(dtype) / 1e9:.0f} GFLOP/s")
    print(f"memory read: {memory_bandwidth() / 1e9:.1f} GB/s")


if __name__ == "__main__":
    main()
