#!/usr/bin/env python
"""Ours served against llama.cpp at 7B on this CPU, one command: prefill, one stream, eight streams.

    .venv/bin/python benchmarks/cpu_vs_llama_cpp.py DIR --threads 2
    .venv/bin/python benchmarks/cpu_vs_llama_cpp.py DIR --threads 2 \\
        --llama-python ~/llamacpp/bin/python --llama-src llama_cpp_python-0.3.36/vendor/llama.cpp
    .venv/bin/python benchmarks/cpu_vs_llama_cpp.py DIR --threads 2 --isa avx2 \\
        --llama-python ~/llamacpp-avx2/bin/python --llama-src ...

DIR is real_scale.py's (its LLaVA-1.5-7B-shaped model is built there once when missing; `--shape tiny`:
the same at toy shapes, a smoke run). Four systems,
one after another in their own processes (never two models in memory at once), the page cache dropped
before each where this user may (root), each warmed up first (an 8-token prompt, one token out: every
weight read once):
- ours, `appliance serve` with its defaults (engine.dtype=auto), through the official `openai` client;
- ours served with engine.quantization=int8, and with int4 (`--systems ...,ours-int4`);
- llama.cpp BF16 and Q8_0 (benchmarks/llama_cpp_decode.py, run by `--llama-python`, a Python with
  llama-cpp-python installed: see that file), GGUFs of the same weights, converted once into DIR/7b/gguf/
  by the llama.cpp source's convert_hf_to_gguf.py (`--llama-src`); skipped without them. Q4_K_M
  (`llama-q4_k_m`), llama.cpp's recommended 4-bit type, is made from the BF16 GGUF by llama.cpp's own
  quantiser (llama_model_quantize).
Same token-id prompts for all (real_scale.py's `text_prompt`, 32 tokens), greedy, EOS ignored:
- prefill: 8 prompts at once, prompt tokens / time to the last first token;
- one stream: decode ms/token after the first token (`--tokens` out);
- 8 streams: tok/s while all eight decode (no prefill in it).
Also the host's fp32 GEMM rate (torch, a prefill-sized product of the model, same threads) and the
prefill's FLOP rate as a share of it.

`--isa avx2` runs both sides on AVX2 code on a newer CPU: our engine with engine.cpu_features_off naming
the CPU's AVX-512, AVX-VNNI and AMX flags and torch's own code held to AVX2 (ATEN_CPU_CAPABILITY,
ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS); llama.cpp must be a build without them (GGML_NATIVE=OFF,
GGML_AVX512=OFF, GGML_AVX_VNNI=OFF): its system info, printed in the table's notes, shows which it is.
"""
import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from real_scale import SHAPES, WARMUP_IDS, all_decoding_rate, build, text_prompt  # benchmarks/ on the path
from serve import Server

from appliance.engine.host import Host  # real_scale puts the repository on the path

STREAMS = 8
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
GGUF_TYPES = {"bf16": "BF16", "q8_0": "Q8_0", "q4_k_m": "Q4_K_M"}
QUANTIZED_FROM_BF16 = {"q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M"}  # made by llama.cpp's quantiser, not the converter
PAIRS = (("ours", "llama-bf16"), ("ours-int8", "llama-q8_0"), ("ours-int4", "llama-q4_k_m"))


def cpu_flags() -> frozenset:
    return Host.read().cpu_flags


def beyond_avx2(flags: set) -> list:
    """The flags an AVX2-only CPU lacks that our rules or torch read."""
    return sorted(f for f in flags if f.startswith(("avx512", "amx", "avx_vnni")))


def drop_page_cache() -> str:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "dropped"
    except OSError:
        return "kept (dropping it needs root)"


# ---- ours ------------------------------------------------------------------------------------------------

async def drive(port: int, tokens: int) -> dict:
    """Warm-up, one stream, then eight at once, over /v1/completions, streaming."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=3600)

    async def one(prompt: list, max_tokens: int, t0: float) -> list:
        arrivals = []
        # logprobs: a chunk for every token, text or not (a random model's tokens often decode to none)
        stream = await client.completions.create(model="llava-1.5-7b", prompt=prompt, stream=True, logprobs=1,
                                                 max_tokens=max_tokens, temperature=0, extra_body={"ignore_eos": True})
        async for chunk in stream:
            for choice in chunk.choices:
                arrivals += [time.perf_counter() - t0] * len(choice.logprobs.tokens)
        if len(arrivals) != max_tokens:
            raise RuntimeError(f"{len(arrivals)} tokens arrived of {max_tokens}")
        return arrivals

    await one(WARMUP_IDS, 1, time.perf_counter())
    single = await one(text_prompt(0), tokens, time.perf_counter())
    t0 = time.perf_counter()  # one clock for the eight: the window where all decode is read across them
    many = await asyncio.gather(*[one(text_prompt(n), tokens, t0) for n in range(1, STREAMS + 1)])
    await client.close()
    prompt_tokens = sum(len(text_prompt(n)) for n in range(1, STREAMS + 1))
    return {"prefill_tok_s": prompt_tokens / max(a[0] for a in many),
            "decode_ms": 1000 * (single[-1] - single[0]) / (len(single) - 1),
            "decoding_tok_s": all_decoding_rate(many)}


def ours(root: Path, args, quantization: str) -> dict:
    overrides = ["pipeline=llava_chat", "model=llava_1_5_7b", f"model.path={root / 'llava'}",
                 f"engine.quantization={quantization}", "server.limits.request_timeout_s=7200"]
    env = {"OMP_NUM_THREADS": str(args.threads)}
    if args.isa == "avx2":
        overrides.append(f"engine.cpu_features_off=[{','.join(beyond_avx2(cpu_flags()))}]")
        env.update(AVX2_ENV)
    with Server(*overrides, cwd=REPO, env=env, startup_s=1800) as server:
        out = asyncio.run(drive(server.port, args.tokens))
        log = server.log_text()
    out["dtype"] = next((line.split("engine.dtype: ", 1)[1].split()[0] for line in log.splitlines()
                         if "engine.dtype: " in line), "?")
    out["kernels"] = next((line.split("kernels (", 1)[1] for line in log.splitlines() if "kernels (" in line), "?")
    return out


# ---- llama.cpp ---------------------------------------------------------------------------------------------

def gguf_source(root: Path) -> Path:
    """The LLaVA checkpoint as llama.cpp's converter reads it (it takes llava-hf's layout and skips the vision
    tower): links to its weights and config, and the tokenizer files with two changes: every id below
    vocab_size in tokenizer.json's vocab (the converter does not fill gaps: the built model's tokenizer has
    427 tokens and 32064 rows), and no list-valued `extra_special_tokens` (which transformers 4, the
    converter's, cannot read)."""
    source, llava = root / "gguf" / "source", root / "llava"
    source.mkdir(parents=True, exist_ok=True)
    for path in llava.iterdir():
        if path.suffix in (".safetensors", ".jinja") or path.name in ("config.json", "model.safetensors.index.json"):
            (source / path.name).unlink(missing_ok=True)
            (source / path.name).symlink_to(path)
    vocab_size = json.loads((llava / "config.json").read_text())["text_config"]["vocab_size"]
    tokenizer = json.loads((llava / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab.update({added["content"]: added["id"] for added in tokenizer["added_tokens"]})
    taken = set(vocab.values())
    vocab.update({f"<unused_{i}>": i for i in range(vocab_size) if i not in taken})
    (source / "tokenizer.json").write_text(json.dumps(tokenizer))
    config = json.loads((llava / "tokenizer_config.json").read_text())
    if isinstance(config.get("extra_special_tokens"), list):
        del config["extra_special_tokens"]
    (source / "tokenizer_config.json").write_text(json.dumps(config))
    return source


def gguf(root: Path, args, kind: str) -> Path:
    """DIR/<shape>/gguf/llava-text-<kind>.gguf, converted from the LLaVA checkpoint once (its language model)."""
    path = root / "gguf" / f"llava-text-{kind}.gguf"
    if not path.exists() and kind in QUANTIZED_FROM_BF16:
        quantize(args, gguf(root, args, "bf16"), path, QUANTIZED_FROM_BF16[kind])
    elif not path.exists():
        if not args.llama_src:
            raise RuntimeError(f"{path} is missing: give --llama-src (llama.cpp's source) to convert it")
        path.parent.mkdir(exist_ok=True)
        partial = path.with_suffix(".partial")
        subprocess.run([args.llama_python, str(Path(args.llama_src) / "convert_hf_to_gguf.py"), str(gguf_source(root)),
                        "--outtype", kind, "--outfile", str(partial)], check=True)
        partial.rename(path)
    return path


def quantize(args, source: Path, path: Path, ftype: str) -> None:
    """`path` quantised from the GGUF `source` to llama.cpp's `ftype`, by its own quantiser."""
    code = f"""if True:
        import ctypes, llama_cpp
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.nthread = llama_cpp.{ftype}, {args.threads}
        raise SystemExit(llama_cpp.llama_model_quantize({str(source)!r}.encode(), {str(path) + '.partial'!r}.encode(),
                                                        ctypes.byref(params)))"""
    subprocess.run([args.llama_python, "-c", code], check=True)
    Path(str(path) + ".partial").rename(path)


def llama_cpp(root: Path, args, kind: str) -> dict:
    result = subprocess.run([args.llama_python, str(REPO / "benchmarks" / "llama_cpp_decode.py"),
                             str(gguf(root, args, kind)), "--threads", str(args.threads), "--tokens", str(args.tokens),
                             "--json"], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError((result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[-1])
    return {**json.loads(result.stdout.strip().splitlines()[-1]), "dtype": GGUF_TYPES[kind]}


# ---- the host's fp32 GEMM rate -------------------------------------------------------------------------------

def fp32_gemm_gflops(args) -> float:
    """torch's fp32 product of a prefill's activations (8 x 32 rows) with the MLP's up projection, in a
    child process with the run's threads and ISA; best of 5."""
    code = """if True:
        import time, torch
        a, w, times = torch.randn(256, 4096), torch.randn(4096, 11008), []
        for _ in range(6):
            start = time.perf_counter()
            torch.mm(a, w)
            times.append(time.perf_counter() - start)
        print(2 * 256 * 4096 * 11008 / min(times) / 1e9)"""
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), **(AVX2_ENV if args.isa == "avx2" else {})}
    return float(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                check=True).stdout)


def prefill_flop_per_token(root: Path) -> float:
    """2 x the language model's linear weights a prompt token multiplies (the LM head runs on the last
    token only)."""
    text = json.loads((root / "llava" / "config.json").read_text())["text_config"]
    h, i, layers = text["hidden_size"], text["intermediate_size"], text["num_hidden_layers"]
    kv = h * text.get("num_key_value_heads", text["num_attention_heads"]) // text["num_attention_heads"]
    return 2 * layers * (2 * h * h + 2 * h * kv + 3 * h * i)


# ---- the table ------------------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", type=Path, help="real_scale.py's directory (the 7B model is built there once)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="7b", help="tiny: the same at toy shapes (a smoke run)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--tokens", type=int, default=32, help="tokens out per stream (at least 2)")
    ap.add_argument("--isa", choices=["native", "avx2"], default="native")
    ap.add_argument("--llama-python", help="a Python with llama-cpp-python (see benchmarks/llama_cpp_decode.py)")
    ap.add_argument("--llama-src", help="llama.cpp's source (convert_hf_to_gguf.py), to make the GGUFs once")
    ap.add_argument("--systems", default="ours,ours-int8,llama-bf16,llama-q8_0")
    args = ap.parse_args()
    if args.tokens < 2:
        ap.error("--tokens must be at least 2")
    root = args.dir / args.shape
    build(root, args.shape)
    systems = {"ours": lambda: ours(root, args, "none"), "ours-int8": lambda: ours(root, args, "int8"),
               "ours-int4": lambda: ours(root, args, "int4"),
               **{f"llama-{kind}": (lambda kind=kind: llama_cpp(root, args, kind)) for kind in GGUF_TYPES}}
    rows, notes = {}, []
    for name in args.systems.split(","):
        if name.startswith("llama") and not args.llama_python:
            notes.append(f"{name}: skipped (no --llama-python)")
            continue
        cache = drop_page_cache()
        started = time.perf_counter()
        try:
            rows[name] = systems[name]()
        except (RuntimeError, subprocess.CalledProcessError) as e:
            notes.append(f"{name} failed: {e}")
            continue
        rows[name]["cache"] = cache
        print(f"{name}: {json.dumps(rows[name])} ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
    gemm = fp32_gemm_gflops(args)
    flop = prefill_flop_per_token(root)

    flags = cpu_flags()
    shown = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16") if f in flags]
    print(f"\ncpu_vs_llama_cpp: {args.shape}-shaped LLaVA text model, {args.threads} threads, isa {args.isa}, "
          f"{args.tokens} tokens a stream; CPU flags: {' '.join(shown)}"
          + (f" (hidden from both sides: {' '.join(beyond_avx2(flags))})" if args.isa == "avx2" else ""))
    print(f"host fp32 GEMM (torch, 256x4096 @ 4096x11008): {gemm:.0f} GFLOP/s\n")
    print("| system | dtype | prefill, 8 prompts | one stream | 8 streams | prefill FLOP rate |")
    print("|---|---|---:|---:|---:|---:|")
    for name, r in rows.items():
        decoding = "n/a" if r["decoding_tok_s"] is None else f"{r['decoding_tok_s']:.2f} tok/s"  # never all at once
        print(f"| {name} | {r.get('dtype', '')} | {r['prefill_tok_s']:.1f} tok/s | {r['decode_ms']:.0f} ms/token "
              f"| {decoding} | {r['prefill_tok_s'] * flop / 1e9:.0f} GFLOP/s "
              f"({100 * r['prefill_tok_s'] * flop / 1e9 / gemm:.0f} % of fp32 GEMM) |")
    for mine, theirs in PAIRS:
        if mine in rows and theirs in rows:
            a, b = rows[mine], rows[theirs]
            streams = (f"{a['decoding_tok_s'] / b['decoding_tok_s']:.2f}x"
                       if a["decoding_tok_s"] and b["decoding_tok_s"] else "n/a")
            print(f"{mine} / {theirs}: prefill {a['prefill_tok_s'] / b['prefill_tok_s']:.2f}x, one stream "
                  f"{b['decode_ms'] / a['decode_ms']:.2f}x (their ms / ours), 8 streams {streams}")
    for name, r in rows.items():
        notes.append(f"{name}: page cache {r['cache']}; " + (f"kernels ({r['kernels']}" if "kernels" in r
                                                               else f"llama.cpp {r['version']}: {r['system_info']}"))
    print("\n" + "\n".join(notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
