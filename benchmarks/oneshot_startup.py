#!/usr/bin/env python
"""One image question asked once: `appliance run` against transformers' `from_pretrained` + `generate`
on the same LLaVA directory, each a fresh process (page cache warm: one run of each first, not counted),
and where our run's seconds go, stage by stage.

    .venv/bin/python benchmarks/oneshot_startup.py DIR                 # DIR: a LLaVA-1.5 HF directory
    .venv/bin/python benchmarks/oneshot_startup.py DIR --repeat 3 --trees /path/to/other/checkout,.
                      # ours from each checkout (before/after a change), best of 3 each
    .venv/bin/python benchmarks/oneshot_startup.py DIR --no-profile    # wall times only

`benchmarks/real_scale.py`'s builder writes such a directory at any shape (random weights, the real
layout). Measured (wall time of the whole process: interpreter start, imports, load, answer, exit; the
best of `--repeat` runs; the host's other load moves single runs):
- transformers: `LlavaForConditionalGeneration.from_pretrained` (bf16) + `AutoProcessor` + `generate`
  (greedy, `--max-tokens` new tokens) on the image and question;
- ours: `appliance run pipeline=llava_chat model=llava_1_5_7b model.path=DIR input=IMG prompt=...`,
  `pipeline.stages.engine.sampling.max_tokens` the same, `ignore_eos` so both produce as many tokens.
Then one more run of ours under cProfile: the cumulative seconds of the functions that make each stage
(`STAGES`; imports are counted inside the stage that triggers them, and also on their own line; cProfile
slows Python-heavy stages, not the ones in native code). Printed as two tables (wall times; stages, one
column per checkout) under a line with the date, the CPU's flags and the load average before and after:
a busy host moves every figure.
"""
import argparse
import datetime
import os
import re
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from image_preprocess import photo_like  # benchmarks/ is on the path only from here
from real_scale import NATIVE_FLAGS, QUESTION

# (stage, file the function lives in, function): cumulative seconds of its outermost calls.
STAGES = [
    ("config composition", "appliance/config/compose.py", "compose"),
    ("pipeline check (model fits, files)", "appliance/pipeline.py", "check"),
    ("preflight", "appliance/pipeline.py", "preflight"),
    ("tokenizer load", "appliance/engine/llm_engine.py", "load_tokenizer"),
    ("chat_prompt setup (image processor)", "appliance/stages/chat/prompt.py", "setup"),
    ("engine start (all below)", "appliance/engine/llm_engine.py", "__init__"),
    ("  memory plan", "appliance/engine/model_fit.py", "generate_fit"),
    ("  kernel plan (probes)", "appliance/engine/kernel_plan.py", "plan_kernels"),
    ("  model built on meta", "appliance/engine/materialize.py", "build_on_meta"),
    ("  weights: storage", "appliance/engine/materialize.py", "materialize"),
    ("  weights: read + copy", "appliance/engine/loader.py", "load_named_weights"),
    ("  weights: int8 / int4", "appliance/engine/linear.py", "quantize_projections"),
    ("  weights: packed panels", "appliance/engine/linear.py", "pack_for_cpu"),
    ("  weights: bf16 kernel", "appliance/engine/linear.py", "use_bf16_kernel"),
    ("  KV cache allocation", "appliance/engine/model_runner.py", "_allocate_kv_cache"),
    ("image preprocessing", "appliance/vision/clip_preprocess.py", "clip_preprocess"),
    ("image encode (vision tower)", "appliance/engine/model_runner.py", "_encode_new_images"),
    ("forward steps (prefill + decode)", "appliance/engine/model_runner.py", "execute"),
    ("teardown (stages closed)", "appliance/pipeline.py", "close"),
    ("imports (inside the above)", "<frozen importlib._bootstrap>", "_find_and_load"),
    ("whole run (profiled)", "appliance/cli.py", "main"),
]

TRANSFORMERS = """
import sys, torch
from PIL import Image
from transformers import AutoProcessor, LlavaForConditionalGeneration
path, image, question, tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
model = LlavaForConditionalGeneration.from_pretrained(path, dtype=torch.bfloat16).eval()
processor = AutoProcessor.from_pretrained(path)
chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
text = processor.apply_chat_template(chat, add_generation_prompt=True)
inputs = processor(images=Image.open(image), text=text, return_tensors="pt")
with torch.inference_mode():
    out = model.generate(**inputs, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
print(processor.decode(out[0, inputs["input_ids"].shape[1]:]))
"""


def env_for(tree: Path) -> dict:
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PYTHONPATH": str(tree), "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}


def ours_argv(model: str, image: str, tokens: int) -> list:
    return ["-m", "appliance.cli", "run", "pipeline=llava_chat", "model=llava_1_5_7b", f"model.path={model}",
            f"input={image}", f"prompt={QUESTION}", f"pipeline.stages.engine.sampling.max_tokens={tokens}",
            "+pipeline.stages.engine.sampling.ignore_eos=true"]


def timed(argv: list, env: dict, cwd: str) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{' '.join(argv[:6])} ... failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return wall


def best_of(argv: list, env: dict, cwd: str, repeat: int) -> list:
    timed(argv, env, cwd)  # page cache warm, imports' files cached: not counted
    return [timed(argv, env, cwd) for _ in range(repeat)]


def check_stages(tree: Path) -> None:
    """Every stage's function is still defined where STAGES says (a renamed one would read as 0 s)."""
    for stage, file, function in STAGES:
        if file.startswith("<"):
            continue
        path = tree / file
        if not path.is_file() or not re.search(rf"^\s*def {function}\(", path.read_text(), re.MULTILINE):
            raise SystemExit(f"stage {stage.strip()!r}: no def {function}( in {path}; update STAGES")


def stage_seconds(profile: str) -> list:
    stats = pstats.Stats(profile).stats  # {(file, line, function): (cc, nc, tottime, cumtime, callers)}
    rows = []
    for stage, file, function in STAGES:
        # Several defs of one name in a file (Pipeline.check calls Stage.check): the outermost, the largest.
        rows.append((stage, max((v[3] for (f, _, fn), v in stats.items() if fn == function and f.endswith(file)),
                                default=0.0)))
    return rows


def markdown(header: list, rows: list) -> str:
    lines = [header, *rows]
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    def fmt(cells):
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"
    return "\n".join([fmt(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(fmt, rows)])


def host_line() -> str:
    flags = set(Path("/proc/cpuinfo").read_text().split()) if Path("/proc/cpuinfo").exists() else set()
    named = " ".join(f for f in NATIVE_FLAGS if f in flags) or "none of " + " ".join(NATIVE_FLAGS)
    return f"{datetime.date.today()}; CPU flags: {named}; {os.cpu_count()} CPUs"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="a LLaVA-1.5 HF directory (real_scale.py's builder writes one)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs of each, after one untimed")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--trees", default=str(REPO), help="comma-separated checkouts to run ours from (before/after)")
    ap.add_argument("--no-profile", action="store_true", help="skip the profiled run of ours")
    ap.add_argument("--skip-transformers", action="store_true")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    model = str(Path(args.model).resolve())
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    for tree in trees:
        check_stages(tree)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        image = str(Path(tmp) / "question.png")
        photo_like(100, 640, 480).save(image)
        walls = {}
        if not args.skip_transformers:
            walls["transformers"] = best_of([sys.executable, "-c", TRANSFORMERS, model, image, QUESTION,
                                             str(args.max_tokens)], env_for(REPO), tmp, args.repeat)
        names = {tree: "ours" if len(trees) == 1 else f"ours ({tree})" for tree in trees}
        for tree in trees:
            walls[names[tree]] = best_of([sys.executable, *ours_argv(model, image, args.max_tokens)],
                                         env_for(tree), tmp, args.repeat)
        stages = {}
        for tree in [] if args.no_profile else trees:
            profile = str(Path(tmp) / "ours.prof")
            timed([sys.executable, "-m", "cProfile", "-o", profile, *ours_argv(model, image, args.max_tokens)],
                  env_for(tree), tmp)
            stages[names[tree]] = stage_seconds(profile)
    print(f"\noneshot_startup: one image question, {args.max_tokens} tokens, {model}; {host_line()}; "
          f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    base = min(walls["transformers"]) if "transformers" in walls else None
    print(f"\nwall seconds of the whole process, best of {args.repeat} (after one untimed run of each)")
    print(markdown(["run", "best s", "runs s", "x transformers"],
                   [[name, f"{min(runs):.1f}", ", ".join(f"{w:.1f}" for w in runs),
                     f"{min(runs) / base:.2f}x" if base else ""] for name, runs in walls.items()]))
    if stages:
        print("\nours, stage by stage (one run under cProfile, cumulative seconds)")
        columns = list(stages)
        print(markdown(["stage", *columns], [[stage, *(f"{dict(stages[c])[stage]:.2f}" for c in columns)]
                                             for stage, _, _ in STAGES]))


if __name__ == "__main__":
    main()
