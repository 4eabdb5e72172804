"""Each of our CPU kernels against torch.compile (inductor, CPU) of the same fused op, and torch eager.

    .venv/bin/python benchmarks/kernels_vs_compile.py --threads 2 --rounds 7

Shapes of engine_throughput.py's bench model (hidden 512, 8 heads of 64, intermediate 1408, vocab 32000,
KV blocks of 16) at a 32-sequence decode step (32 rows) and a prefill step (2048 rows; 1 row for the
GEMMs too). The torch code is what the engine runs without our kernels (the layers' fallback paths);
torch.compile gets it as one function, `dynamic=False` (compiled per shape, as generous as it gets),
compiled and warmed before timing. The GEMM also runs compiled with inductor's weight freezing (oneDNN
prepacked weights, its best CPU path for a linear with constant weights) and, with --max-autotune, with
inductor's C++ GEMM template. Variants are timed in interleaved rounds (each round: every variant,
`--iters` calls each, order rotated); the table gives the median over rounds of the per-call time, so
a neighbour's load on a shared host moves all columns alike.
"""
import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

HIDDEN, HEADS, HEAD_DIM, INTER, VOCAB, BLOCK = 512, 8, 64, 1408, 32000, 16


def timed(fn, iters):
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t) / iters


def compare(name, variants, rounds, iters):
    """variants: {label: zero-arg callable}; returns {label: median seconds per call}."""
    for fn in variants.values():  # warm-up (compiles)
        fn()
        fn()
    samples = {label: [] for label in variants}
    labels = list(variants)
    for r in range(rounds):
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:
            samples[label].append(timed(variants[label], iters))
    result = {label: statistics.median(s) for label, s in samples.items()}
    cells = "  ".join(f"{label} {v * 1e6:9.1f} us" for label, v in result.items())
    ours, best = result["ours"], min(v for k, v in result.items() if k.startswith("compile"))
    print(f"{name:34s} {cells}   compile/ours {best / ours:5.2f}x", flush=True)
    return result


def compiled(fn):
    return torch.compile(fn, backend="inductor", dynamic=False, fullgraph=True)


def gemm_rows(rows, rounds, iters, max_autotune):
    from appliance.engine import cpu_kernels

    shapes = {"qkv": (3 * HIDDEN, HIDDEN), "o": (HIDDEN, HIDDEN), "gate_up": (2 * INTER, HIDDEN),
              "down": (HIDDEN, INTER)}
    weights = [torch.randn(n, k) * 0.02 for n, k in shapes.values()]
    packed = [cpu_kernels.PackedWeight(w) for w in weights]
    xs = [torch.randn(rows, k) for _, k in shapes.values()]

    class Layer(torch.nn.Module):  # the four linears of a decoder layer, weights as parameters
        def __init__(self):
            super().__init__()
            self.ws = torch.nn.ParameterList([torch.nn.Parameter(w, requires_grad=False) for w in weights])

        def forward(self, *x):
            return [F.linear(xi, w) for xi, w in zip(x, self.ws)]

    layer = Layer().eval()
    variants = {
        "ours": lambda: [cpu_kernels.linear(x, p) for x, p in zip(xs, packed)],
        "eager": lambda: layer(*xs),
        "compile": (lambda f: lambda: f(*xs))(compiled(layer)),
    }
    import torch._inductor.config as inductor_config

    with inductor_config.patch(freezing=True):
        frozen = compiled(layer)
        frozen(*xs)
    variants["compile+freezing"] = lambda: frozen(*xs)
    if max_autotune:
        with inductor_config.patch(freezing=True, max_autotune=True, max_autotune_gemm_backends="CPP,ATEN"):
            tuned = torch.compile(layer, backend="inductor", dynamic=False, mode="max-autotune-no-cudagraphs")
            tuned(*xs)
        variants["compile+autotune"] = lambda: tuned(*xs)
    with torch.inference_mode():
        return compare(f"GEMM, a layer's 4 linears, {rows} rows", variants, rounds, iters)


def lm_head(rows, rounds, iters):
    from appliance.engine import cpu_kernels

    w = torch.randn(VOCAB, HIDDEN) * 0.02
    packed, x = cpu_kernels.PackedWeight(w), torch.randn(rows, HIDDEN)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False).eval()
    head.weight.data = w
    import torch._inductor.config as inductor_config

    with torch.inference_mode():
        plain = compiled(head)
        with inductor_config.patch(freezing=True):
            frozen = compiled(head)
            frozen(x)
        return compare(f"GEMM, LM head 32000x512, {rows} rows",
                       {"ours": lambda: cpu_kernels.linear(x, packed), "eager": lambda: head(x),
                        "compile": lambda: plain(x), "compile+freezing": lambda: frozen(x)}, rounds, iters)


def decode_attention(batch, rounds, iters):
    from appliance.engine import cpu_kernels

    g = torch.Generator().manual_seed(0)
    lens = torch.randint(100, 380, (batch,), generator=g)
    width = int(-(-lens.max() // BLOCK))
    num_blocks = batch * width + 8
    k_cache = torch.randn(num_blocks, BLOCK, HEADS, HEAD_DIM, generator=g)
    v_cache = torch.randn(num_blocks, BLOCK, HEADS, HEAD_DIM, generator=g)
    tables = torch.randperm(num_blocks, generator=g)[: batch * width].view(batch, width)
    q = torch.randn(batch, HEADS, HEAD_DIM, generator=g)
    scale = HEAD_DIM ** -0.5

    def torch_decode(q, k_cache, v_cache, tables, lens):  # the torch backend's batched decode
        n, w = tables.shape
        length = w * BLOCK
        k = k_cache.index_select(0, tables.flatten()).view(n, length, HEADS, HEAD_DIM).transpose(1, 2)
        v = v_cache.index_select(0, tables.flatten()).view(n, length, HEADS, HEAD_DIM).transpose(1, 2)
        mask = torch.arange(length) < lens[:, None]
        return F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=mask[:, None, None, :],
                                              scale=scale).squeeze(2)

    fn = compiled(torch_decode)
    with torch.inference_mode():
        return compare(f"paged decode attention, {batch} seqs",
                       {"ours": lambda: cpu_kernels.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale),
                        "eager": lambda: torch_decode(q, k_cache, v_cache, tables, lens),
                        "compile": lambda: fn(q, k_cache, v_cache, tables, lens)}, rounds, iters)


def small_ops(rows, rounds, iters):
    from appliance.engine import cpu_kernels

    out = {}
    eps = 1e-6
    x, w = torch.randn(rows, HIDDEN), torch.randn(HIDDEN)

    def rms(x, w):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return w * h

    gu = torch.randn(rows, 2 * INTER)

    def silu_mul(x):
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up

    qkv = torch.randn(rows, (HEADS * 3) * HEAD_DIM)
    q = qkv[:, :HEADS * HEAD_DIM].view(rows, HEADS, HEAD_DIM)
    k = qkv[:, HEADS * HEAD_DIM:2 * HEADS * HEAD_DIM].view(rows, HEADS, HEAD_DIM)
    v = qkv[:, 2 * HEADS * HEAD_DIM:].view(rows, HEADS, HEAD_DIM)
    from appliance.engine.layers import RotaryEmbedding

    rope = RotaryEmbedding(HEAD_DIM, 4096)  # the real table: applied in place again and again, q and k keep
    cos, sin = rope.cos, rope.sin           # their norms (a random table would overflow them into inf/NaN)
    positions = torch.randint(0, 4096, (rows,))

    def rotate_half(t):
        a, b = t.chunk(2, dim=-1)
        return torch.cat([-b, a], dim=-1)

    def rotary(q, k, positions):
        c, s = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
        return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s

    k_cache = torch.zeros(rows // BLOCK + 64, BLOCK, HEADS, HEAD_DIM)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.randperm(k_cache.shape[0] * BLOCK)[:rows]

    def write_kv(k, v, slots):
        k_cache.view(-1, HEADS, HEAD_DIM)[slots] = k
        v_cache.view(-1, HEADS, HEAD_DIM)[slots] = v

    logits = torch.randn(min(rows, 32), VOCAB)  # rows that sample: at most one per sequence

    def argmax(x):
        return x.argmax(dim=-1)

    with torch.inference_mode():
        c = {f: compiled(f) for f in (rms, silu_mul, rotary, write_kv, argmax)}
        out["rms_norm"] = compare(f"RMSNorm, {rows} x 512", {
            "ours": lambda: cpu_kernels.rms_norm(x, w, eps), "eager": lambda: rms(x, w),
            "compile": lambda: c[rms](x, w)}, rounds, iters)
        out["silu_mul"] = compare(f"SwiGLU, {rows} x 2x1408", {
            "ours": lambda: cpu_kernels.silu_mul(gu), "eager": lambda: silu_mul(gu),
            "compile": lambda: c[silu_mul](gu)}, rounds, iters)
        out["rotary"] = compare(f"rotary q+k, {rows} tokens", {
            "ours": lambda: cpu_kernels.rotary_(q, k, positions, cos, sin), "eager": lambda: rotary(q, k, positions),
            "compile": lambda: c[rotary](q, k, positions)}, rounds, iters)
        out["write_kv"] = compare(f"KV-cache write, {rows} tokens", {
            "ours": lambda: cpu_kernels.write_kv(k, v, slots, k_cache, v_cache), "eager": lambda: write_kv(k, v, slots),
            "compile": lambda: c[write_kv](k, v, slots)}, rounds, iters)
        out["argmax"] = compare(f"argmax, {logits.shape[0]} x 32000", {
            "ours": lambda: cpu_kernels.argmax_rows(logits), "eager": lambda: argmax(logits),
            "compile": lambda: c[argmax](logits)}, rounds, iters)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=20, help="calls per variant per round (x10 for small ops)")
    ap.add_argument("--max-autotune", action="store_true", help="also inductor's C++ GEMM template (slow to compile)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from appliance.engine import cpu_kernels

    if not cpu_kernels.available():
        raise SystemExit(f"CPU kernels unavailable: {cpu_kernels.unavailable_reason()}")
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, load average {os.getloadavg()}")
    for rows in (1, 32, 2048):
        gemm_rows(rows, args.rounds, args.iters if rows > 1 else args.iters * 10, args.max_autotune)
    lm_head(32, args.rounds, args.iters)
    decode_attention(32, args.rounds, args.iters)
    for rows in (32, 2048):
        small_ops(rows, args.rounds, args.iters * 10 if rows == 32 else args.iters)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
