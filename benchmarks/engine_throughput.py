"""Offline throughput of the generation engine against transformers baselines.

    .venv/bin/python benchmarks/engine_throughput.py                 # full run (32 requests)
    .venv/bin/python benchmarks/engine_throughput.py --num-requests 8 --hf-requests 4   # quick

Bench model: random Llama (hidden 512, intermediate 1408, 8 layers, 8 heads, vocab 32000), fp32.
On a GPU (`--device cuda --dtype bfloat16`, as scripts/gpu_checks.sh runs it) every system runs there.
Requests: prompt lengths uniform in [32, 256], forced output lengths uniform in [16, 128]
(ignore_eos), seed 0. Prints output tokens/s for our engine (with its CPU kernels, and with torch's alone), HF generate
one request at a time and HF generate in left-padded static batches, plus engine step time vs a
bare forward of the same batch, KV slot utilisation, and the engine in bf16. Then, per engine dtype
(fp32, bf16, int8 weights), a roofline table: batched model FLOP/s (2 x linear weights x prompt and
output tokens / wall) against the host's fastest measured GEMM (fp32 or bf16, `F.linear`), and one
stream's decode (a 64-token prompt, 64 tokens) as weight bytes read per second against the host's
measured memory read rate (benchmarks/roofline.py).
"""
import argparse
import contextlib
import os
import random
import statistics
import tempfile
import time

import torch

from roofline import BYTES_PER_WEIGHT, gemm_flops, linear_weights, memory_bandwidth


def build_model(path: str) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = 32000
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="w2", bos_token="w1",
                            unk_token="w0").save_pretrained(path)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=1024,
                      bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)


def make_requests(n: int, seed: int = 0):
    rng = random.Random(seed)
    return [([rng.randrange(3, 32000) for _ in range(rng.randint(32, 256))], rng.randint(16, 128))
            for _ in range(n)]


@contextlib.contextmanager
def bench_model(model_dir=None, build=build_model):
    """The bench model's directory: `model_dir` if it holds one, else built there by `build` (or in a
    temp directory, removed afterwards)."""
    if model_dir and os.path.exists(os.path.join(model_dir, "config.json")):
        yield model_dir
        return
    with contextlib.ExitStack() as stack:
        path = model_dir or stack.enter_context(tempfile.TemporaryDirectory())
        build(path)
        yield path


def generate_tok_s(engine, requests):
    """Add the requests (greedy, forced output lengths) and step to completion: (output tokens/s, tokens)."""
    from appliance.engine.sampling_params import SamplingParams

    for prompt, n in requests:
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, seed=0))
    produced, start = 0, time.perf_counter()
    while engine.has_unfinished():
        produced += sum(len(o.new_token_ids) for o in engine.step())
    return produced / (time.perf_counter() - start), produced


class StepProbe:
    """Wraps the executor: times each engine step's model run, and re-runs the bare forward of
    decode-only steps on the same inputs for the overhead figure. Also samples KV utilisation."""

    def __init__(self, engine, bare_samples: int = 24):
        self.engine, self.executor = engine, engine.executor
        self.runner = engine.executor.runner  # the engine reads its stats (encoder cache) through it
        self.bare_samples = bare_samples
        self.last_step = None
        self.forward_s, self.batches, self.util = [], [], []
        engine.executor = self

    def run(self, out, masks=None):
        step = self.executor.runner.prepare(out)
        self.last_step = step if all(n == 1 for n in step.query_lens) else None
        return self.executor.runner.run(step, out, masks)

    def after_step(self):
        sync = torch.cuda.synchronize if self.runner.device.type == "cuda" else (lambda: None)
        running = self.engine.scheduler.running
        slots = sum(len(s.block_table) for s in running) * self.engine.cfg.block_size
        if slots:
            self.util.append((sum(s.num_computed_tokens for s in running), slots))
        if self.last_step is not None and len(self.forward_s) < self.bare_samples:
            runner = self.executor.runner
            sync()
            t = time.perf_counter()
            runner.execute(self.last_step)  # rewrites the same K/V values: harmless
            sync()
            self.forward_s.append(time.perf_counter() - t)
            self.batches.append(len(self.last_step.query_lens))
            return True
        return False


def run_engine(path, requests, dtype, max_seqs, cpu_kernels=True, device="cpu", quantization="none"):
    from appliance.config.schema import EngineConfig
    from appliance.engine.llm_engine import LLMEngine
    from appliance.engine.sampling_params import SamplingParams

    extra = dict(device=device, block_size=64) if device != "cpu" else {}  # 64: xformers' paged pages
    cfg = EngineConfig(dtype=dtype, kv_cache_memory_bytes=512 * 2 ** 20, max_num_seqs=max_seqs,
                       max_num_batched_tokens=2048, enable_prefix_caching=False, cpu_kernels=cpu_kernels,
                       quantization=quantization, **extra)
    engine = LLMEngine(path, cfg)
    engine.generate([requests[0][0][:8]], SamplingParams(temperature=0, max_tokens=2))  # warm-up
    probe = StepProbe(engine)
    for prompt, n in requests:
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, seed=0))
    produced, decode_step_s, bare_time = 0, [], 0.0
    start = time.perf_counter()
    while engine.has_unfinished():
        t = time.perf_counter()
        outs = engine.step()
        dt = time.perf_counter() - t
        produced += sum(len(o.new_token_ids) for o in outs)
        t = time.perf_counter()
        if probe.after_step():
            decode_step_s.append(dt)
        bare_time += time.perf_counter() - t
    wall = time.perf_counter() - start - bare_time
    live, slots = map(sum, zip(*probe.util))
    assert produced == sum(n for _, n in requests), "engine produced the wrong number of tokens"
    return {"tok_s": produced / wall, "wall": wall, "step": statistics.median(decode_step_s),
            "forward": statistics.median(probe.forward_s), "batch": statistics.median(probe.batches),
            "util": live / slots, "stats": engine.stats(), "attention": engine.executor.runner.attn_backend.name}


def one_stream_tok_s(path, dtype, quantization="none", prompt_len=64, tokens=64):
    """One request's decode rate: its prefill step (and first token) left out."""
    from appliance.config.schema import EngineConfig
    from appliance.engine.llm_engine import LLMEngine
    from appliance.engine.sampling_params import SamplingParams

    engine = LLMEngine(path, EngineConfig(dtype=dtype, quantization=quantization, enable_prefix_caching=False,
                                          kv_cache_memory_bytes=64 * 2 ** 20))
    prompt = [random.Random(1).randrange(3, 32000) for _ in range(prompt_len)]
    engine.generate([prompt[:8]], SamplingParams(temperature=0, max_tokens=2))  # warm-up
    engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
    engine.step()  # the prefill
    start, produced = time.perf_counter(), 0
    while engine.has_unfinished():
        produced += sum(len(o.new_token_ids) for o in engine.step())
    rate = produced / (time.perf_counter() - start)
    engine.close()
    return rate


def roofline_rows(path, requests, max_seqs, measured):
    """Per engine dtype: (name, batched tok/s, % of GEMM roofline, one-stream tok/s, % of memory roofline).
    `measured`: batched results already run, by name."""
    weights = linear_weights(path)
    tokens = sum(len(p) + n for p, n in requests)
    gemm = {"float32": gemm_flops(torch.float32), "bfloat16": gemm_flops(torch.bfloat16)}
    memory = memory_bandwidth()
    best = max(gemm.values())  # the host's compute roof: its fastest dense GEMM, whatever the dtype
    print(f"\nhost: GEMM fp32 {gemm['float32'] / 1e9:.0f} GFLOP/s, bf16 {gemm['bfloat16'] / 1e9:.0f} GFLOP/s; "
          f"memory read {memory / 1e9:.1f} GB/s; model: {weights / 1e6:.1f}M linear weights")
    rows = []
    for name, dtype, quantization in (("fp32", "float32", "none"), ("bf16", "bfloat16", "none"),
                                      ("int8 weights", "bfloat16", "int8")):
        batched = measured.get(name) or run_engine(path, requests, dtype, max_seqs, quantization=quantization)
        one = one_stream_tok_s(path, dtype, quantization)
        flops = 2 * weights * tokens / batched["wall"]
        read = weights * BYTES_PER_WEIGHT["int8" if quantization == "int8" else dtype] * one
        rows.append((name, batched["tok_s"], 100 * flops / best, one, 100 * read / memory))
    return rows


def run_hf(path, requests, batch_size, device="cpu", dtype="float32"):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device).eval()
    produced = 0
    start = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(requests), batch_size):
            chunk = requests[i:i + batch_size]
            width = max(len(p) for p, _ in chunk)
            ids = torch.tensor([[0] * (width - len(p)) + p for p, _ in chunk], device=device)  # left padding
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in chunk], device=device)
            n = max(m for _, m in chunk)
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, pad_token_id=0)
            produced += sum(m for _, m in chunk)  # useful tokens only; padding rows' extras don't count
    return produced / (time.perf_counter() - start)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--hf-requests", type=int, default=None,
                    help="requests for the HF sequential baseline (default: all; tokens/s is per-token)")
    ap.add_argument("--hf-batch", type=int, default=16)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--skip-bf16", action="store_true")
    ap.add_argument("--skip-roofline", action="store_true", help="skip the per-dtype roofline table")
    ap.add_argument("--skip-torch-kernels", action="store_true",
                    help="skip the engine run with engine.cpu_kernels=false")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads for every system (on a loaded shared host 1 avoids OpenMP stalls)")
    ap.add_argument("--model-dir", default=None, help="reuse a bench model built by an earlier run")
    ap.add_argument("--device", default="cpu", help="cpu or cuda: where the engine and HF generate run")
    ap.add_argument("--dtype", default="float32", help="the first engine row's and HF generate's dtype")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    print(f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()}")
    with bench_model(args.model_dir) as path:
        run_all(args, path)
    print(f"load average after: {os.getloadavg()}")


def run_all(args, path):
    requests = make_requests(args.num_requests)
    print(f"{len(requests)} requests, {sum(len(p) for p, _ in requests)} prompt tokens, "
          f"{sum(n for _, n in requests)} output tokens")

    rows = []
    fp32 = run_engine(path, requests, args.dtype, args.max_num_seqs, device=args.device)
    on_cpu_fp32 = args.device == "cpu" and args.dtype == "float32"
    rows.append(("engine fp32" if on_cpu_fp32 else f"engine {args.dtype}, {args.device} ({fp32['attention']})",
                 fp32["tok_s"]))
    if not args.skip_torch_kernels:
        rows.append(("engine fp32, torch kernels only",
                     run_engine(path, requests, "float32", args.max_num_seqs, cpu_kernels=False)["tok_s"]))
    if not args.skip_hf:
        hf = dict(device=args.device, dtype=args.dtype)
        rows.append(("HF generate, sequential", run_hf(path, requests[: args.hf_requests], 1, **hf)))
        rows.append((f"HF generate, static batch {args.hf_batch}", run_hf(path, requests, args.hf_batch, **hf)))
    measured = {"fp32": fp32} if on_cpu_fp32 else {}
    if not args.skip_bf16:
        measured["bf16"] = run_engine(path, requests, "bfloat16", args.max_num_seqs)
        rows.append(("engine bf16", measured["bf16"]["tok_s"]))

    base = dict(rows).get("HF generate, sequential")
    print(f"\n{'system':32s} {'out tok/s':>10s} {'vs sequential':>14s}")
    for name, tps in rows:
        print(f"{name:32s} {tps:10.1f} {(f'{tps / base:.1f}x' if base else '-'):>14s}")
    overhead = (fp32["step"] - fp32["forward"]) / fp32["forward"] * 100
    print(f"\ndecode step (batch {fp32['batch']}): engine step {fp32['step'] * 1e3:.1f} ms, bare forward "
          f"{fp32['forward'] * 1e3:.1f} ms, overhead {overhead:.1f}%")
    print(f"KV slot utilisation (live tokens / allocated slots, all steps): {fp32['util'] * 100:.1f}%")
    print(f"engine stats: {fp32['stats']}")
    if not args.skip_roofline and args.device == "cpu":
        rows = roofline_rows(path, requests, args.max_num_seqs, measured)
        print(f"{'engine dtype':14s} {'batched tok/s':>14s} {'% GEMM roof':>12s} {'1-stream tok/s':>15s} "
              f"{'% memory roof':>14s}")
        for name, batched, gemm_pct, one, memory_pct in rows:
            print(f"{name:14s} {batched:14.1f} {gemm_pct:11.1f}% {one:15.1f} {memory_pct:13.1f}%")


if __name__ == "__main__":
    main()
