#!/usr/bin/env python
"""llama.cpp's decode figures on this host, for comparison with real_scale.py's `--decode-only` runs.

Given a GGUF of the text model (e.g. the language model of real_scale.py's LLaVA-1.5-7B-shaped build,
quantized to Q8_0), it measures with llama.cpp's batch API, greedy (argmax of the logits, EOS ignored):
- one stream: the prompt of real_scale.py's `text_prompt(0)` (32 tokens), its time, then `--tokens`
  tokens; decode ms/token = time of tokens 2..N / (N - 1);
- 8 streams: `text_prompt(1..8)` decoded together in one batch (one sequence id each), `--tokens`
  tokens each; output tok/s over the whole run, prompts included (as real_scale.py counts it); with
  `--json` (how benchmarks/cpu_vs_llama_cpp.py reads it) instead the eight prompts' prefill tok/s and the
  tok/s of the steps after it, with llama.cpp's version and system info (the CPU features it was built for).
A warm-up (an 8-token prompt, one token out) reads every weight once before either run.

llama-cpp-python is not a dependency of the project; install it in a separate virtual environment
(it builds llama.cpp with CMake, native CPU flags by default; for an AVX2-only build on a newer CPU set
CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF"):

    python3 -m venv ~/llamacpp && CMAKE_BUILD_PARALLEL_LEVEL=2 ~/llamacpp/bin/pip install llama-cpp-python
    ~/llamacpp/bin/pip install torch safetensors sentencepiece "transformers<5" "protobuf<5"

(the converter imports torch only to read tensors: a CPU-only build of torch is enough).

The GGUF converter comes with the sdist, in vendor/llama.cpp (it uses the gguf-py beside it):

    ~/llamacpp/bin/pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36
    tar xzf llama_cpp_python-0.3.36.tar.gz

benchmarks/cpu_vs_llama_cpp.py (`--llama-src llama_cpp_python-0.3.36/vendor/llama.cpp`) converts
real_scale.py's checkpoint with it once (its `gguf_source` says what the converter needs changed) and runs
this script on each GGUF. By hand:

    ~/llamacpp/bin/python benchmarks/llama_cpp_decode.py llava-text-q8_0.gguf --threads 2
"""
import argparse
import json
import sys
import time

import numpy as np

WARMUP_IDS = [1, 5, 6, 7, 8, 9, 10, 11]  # as real_scale.py
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile")
STREAMS = 8


def text_prompt(number: int) -> list:
    """real_scale.py's decode-only prompts: 32 tokens, distinct per stream."""
    return WARMUP_IDS + [1000 + 24 * number + i for i in range(24)]


def cpu_flags() -> str:
    with open("/proc/cpuinfo") as f:
        have = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    return " ".join(f"{flag}={'yes' if flag in have else 'no'}" for flag in FLAGS)


class Streams:
    """One llama.cpp context decoding up to `n_seq` sequences together, greedy."""

    def __init__(self, llama_cpp, model, n_seq: int, n_ctx: int, threads: int):
        self.lib = llama_cpp
        params = llama_cpp.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_seq_max = n_ctx * n_seq, n_ctx * n_seq, n_seq
        params.n_threads = params.n_threads_batch = threads
        self.ctx = llama_cpp.llama_init_from_model(model, params)
        if not self.ctx:
            raise RuntimeError("llama_init_from_model failed")
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
        self.batch = llama_cpp.llama_batch_init(n_ctx * n_seq, 0, 1)

    def close(self):
        self.lib.llama_batch_free(self.batch)
        self.lib.llama_free(self.ctx)

    def reset(self):
        self.lib.llama_memory_clear(self.lib.llama_get_memory(self.ctx), True)

    def step(self, tokens: list, start: list) -> list:
        """Append tokens[s] (a list per sequence s) at positions start[s]; the argmax after each."""
        b, n = self.batch, 0
        for seq, ids in enumerate(tokens):
            for i, token in enumerate(ids):
                b.token[n], b.pos[n], b.n_seq_id[n], b.seq_id[n][0] = token, start[seq] + i, 1, seq
                b.logits[n] = i == len(ids) - 1
                n += 1
        b.n_tokens = n
        if self.lib.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")
        out, row = [], -1
        for ids in tokens:
            row += len(ids)
            logits = self.lib.llama_get_logits_ith(self.ctx, row)
            out.append(int(np.ctypeslib.as_array(logits, shape=(self.n_vocab,)).argmax()))
        return out

    def generate(self, prompts: list, tokens: int) -> list:
        """Greedy decode; the wall-clock time after the prompts and after each further token."""
        self.reset()
        begin = time.perf_counter()
        last = self.step(prompts, [0] * len(prompts))
        times = [time.perf_counter() - begin]
        for k in range(1, tokens):
            last = self.step([[t] for t in last], [len(p) + k - 1 for p in prompts])
            times.append(time.perf_counter() - begin)
        return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("gguf", help="GGUF file of the text model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=32, help="tokens out per stream (at least 2)")
    parser.add_argument("--json", action="store_true", help="one JSON line instead of the table (cpu_vs_llama_cpp.py)")
    args = parser.parse_args()
    if args.tokens < 2:
        parser.error("--tokens must be at least 2")
    try:
        import llama_cpp
    except ImportError:
        print("llama_cpp is not importable from this Python: install llama-cpp-python (see this file's "
              "docstring) and run the script with that environment's python", file=sys.stderr)
        return 2

    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(args.gguf.encode(), llama_cpp.llama_model_default_params())
    if not model:
        print(f"cannot load {args.gguf}", file=sys.stderr)
        return 2
    n_ctx = len(text_prompt(0)) + args.tokens
    one = Streams(llama_cpp, model, 1, n_ctx, args.threads)
    one.generate([WARMUP_IDS], 1)
    times = one.generate([text_prompt(0)], args.tokens)
    one.close()
    many = Streams(llama_cpp, model, STREAMS, n_ctx, args.threads)
    times8 = many.generate([text_prompt(n) for n in range(1, STREAMS + 1)], args.tokens)
    many.close()
    llama_cpp.llama_model_free(model)

    decode_ms = 1000 * (times[-1] - times[0]) / (len(times) - 1)
    decode8_ms = 1000 * (times8[-1] - times8[0]) / (len(times8) - 1)
    if args.json:
        prompt_tokens = sum(len(text_prompt(n)) for n in range(1, STREAMS + 1))
        print(json.dumps({"prefill_tok_s": prompt_tokens / times8[0], "decode_ms": decode_ms,
                          "decoding_tok_s": STREAMS * 1000 / decode8_ms, "version": llama_cpp.__version__,
                          "system_info": llama_cpp.llama_print_system_info().decode().strip()}))
        return 0
    print(f"\nllama_cpp {llama_cpp.__version__}, {args.gguf}, threads={args.threads}, {cpu_flags()}\n")
    print("| run | prompt s | ms/token | tok/s |\n| --- | --- | --- | --- |")
    print(f"| 1 stream | {times[0]:.2f} | {decode_ms:.0f} | {1000 / decode_ms:.2f} |")
    print(f"| {STREAMS} streams | {times8[0]:.2f} | {decode8_ms:.0f} (a step) "
          f"| {STREAMS * args.tokens / times8[-1]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
