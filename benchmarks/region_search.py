#!/usr/bin/env python
"""A region from a STAC search: items a minute with one and with two worker processes, and the share of their
time spent outside the model.

    .venv/bin/python benchmarks/region_search.py --quick      # the embedded tiny flood model, 4 items of 256²
    .venv/bin/python benchmarks/region_search.py --model prithvi_300m_tl_flood \
        --checkpoint DIR/7b/prithvi_300m_tl_flood.pt
                      # 12 items of 1024² at the 300M-TL shape; the checkpoint is real_scale.py's
                      # (`real_scale.py DIR --build-only`), or written first where PATH does not exist yet

The tests' STAC API (tests/stac_api.py: PostgreSQL + stac-fastapi-pgstac on 127.0.0.1) holds `--items`
synthetic HLS-like items in one collection (tests/geo/stac_catalog.py's, at `--side` pixels: tile after
tile, date after date), whose per-band COGs a local range-request server serves (tests/geo/hls.py).
The flood pipeline maps the search into a fresh output directory:
- 1 worker: one process maps every item (and builds the region after them, as `appliance run` does);
- 2 workers: two processes at once, `search.shares=2` with `search.share=0` and `1`, then
  `appliance assemble` builds the region (its seconds, the whole command's, are in "region s").
Each worker is a child process running the pipeline as `appliance run` builds it (compose, build_pipeline,
preflight, run) with torch threads = CPUs / workers. It sets the model up (load s), waits until every
worker is ready, then maps its items; its wall runs from then to its last mask written: the search, the
reads, tiling, the model, stitching and writing. Every forward goes through geo_pipeline.py's timer, so
"outside the model" (1 - forward / wall, the largest of the workers') is measured within the run.
items/min: all items over the slowest worker's wall. A checkpoint written here has random weights: speed
does not depend on them.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path
from typing import List

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from geo_pipeline import table, timed_engine_model  # benchmarks/ is on the path only from here

DEMO_MODEL = "prithvi_demo_flood"  # conf/pipeline/prithvi_flood.yaml's default: the embedded tiny model


# ---- the catalog ----------------------------------------------------------------------------------------

def write_items(root: Path, cog_url: str, count: int, side: int) -> List[dict]:
    """`count` items over the tests' tiles, date after date (tile i % 3, date i // 3), scenes `side` pixels."""
    from tests.geo.stac_catalog import CLOUD_COVER, DATE_STEP_DAYS, FIRST_DATE, TILES, tile_transform, write_item

    items = []
    for i in range(count):
        t, d = i % len(TILES), i // len(TILES)
        day = FIRST_DATE + timedelta(days=DATE_STEP_DAYS * d)
        items.append(write_item(root, cog_url, TILES[t], day, CLOUD_COVER[d % len(CLOUD_COVER)],
                                tile_transform(t), seed=100 * t + d, size=side))
    return items


# ---- a worker: one child process -------------------------------------------------------------------------

def worker(overrides: List[str], threads: int) -> None:
    """Set the pipeline up, say "ready", wait for "go" on stdin, map this worker's items; print its JSON."""
    import torch

    from appliance.config.compose import compose
    from appliance.config.run_inputs import run_record
    from appliance.logs import setup_logging
    from appliance.stages.build import build_pipeline

    torch.set_num_threads(threads)
    cfg = compose(overrides)
    setup_logging(cfg.log_level or "WARNING", cfg.log_format)
    start = time.perf_counter()
    pipeline = build_pipeline(cfg)
    pipeline.check()
    pipeline.setup()
    timer = timed_engine_model(pipeline)
    dtype = str(next(s for s in pipeline.stages if s.name == "engine").engine.dtype).replace("torch.", "")
    load_s = time.perf_counter() - start
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.perf_counter()
    done, records = pipeline.preflight([run_record(cfg)])
    items, last = 0, start
    for record in pipeline.run(records, done):
        if record.get("output_path"):
            items, last = items + 1, time.perf_counter()
    end = time.perf_counter()
    pipeline.close()
    print(json.dumps({"items": items, "wall_s": last - start, "forward_s": timer.seconds, "load_s": load_s,
                      "region_s": end - last, "threads": torch.get_num_threads(), "dtype": dtype}), flush=True)


def run_workers(shares: List[List[str]], threads: int, logs: Path) -> List[dict]:
    """One child per entry of `shares` (its overrides), started together; each one's result."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(threads)}
    children, results = [], []
    try:
        for index, overrides in enumerate(shares):
            log = logs / f"worker_{len(shares)}_{index}.log"
            with open(log, "w") as stderr:
                children.append((subprocess.Popen(
                    [sys.executable, __file__, "--worker", json.dumps(overrides), "--threads", str(threads)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env), log))
        for child, log in children:  # every model set up before any worker starts mapping
            if "ready\n" not in iter(child.stdout.readline, ""):  # read up to it, or to the end: it exited
                raise RuntimeError(failed(child, log))
        for child, _ in children:
            child.stdin.write("go\n")
            child.stdin.flush()
        for child, log in children:
            out, _ = child.communicate()
            if child.returncode != 0:
                raise RuntimeError(failed(child, log))
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:  # a worker that failed leaves the others waiting for "go": stop them
        for child, _ in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    return results


def failed(child, log: Path) -> str:
    child.wait()
    return f"a worker exited {child.returncode}:\n{log.read_text()[-3000:]}"


def assemble_seconds(overrides: List[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "appliance.cli", "assemble", *overrides], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    if done.returncode != 0:
        raise RuntimeError(f"appliance assemble exited {done.returncode}:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


# ---- the table -------------------------------------------------------------------------------------------

def row(workers: int, results: List[dict], region_s: float) -> list:
    items = sum(r["items"] for r in results)
    wall = max(r["wall_s"] for r in results)
    outside = max(1 - r["forward_s"] / r["wall_s"] for r in results)
    load = max(r["load_s"] for r in results)
    return [workers, results[0]["threads"], results[0]["dtype"], items, f"{load:.1f}", f"{wall:.1f}",
            f"{60 * items / wall:.2f}", f"{outside:.1%}", f"{region_s:.1f}"]


def heading(args, model: str) -> str:
    from real_scale import NATIVE_FLAGS

    from appliance.engine.host import Host

    flags = " ".join(f for f in NATIVE_FLAGS if f in Host.read().cpu_flags) or "none of " + " ".join(NATIVE_FLAGS)
    return (f"region_search{' (quick)' if args.quick else ''}, {date.today()}: {model}, {args.items} items of "
            f"{args.side}², engine.dtype={args.dtype}; CPU flags: {flags}; {os.cpu_count()} CPUs, "
            f"load {os.getloadavg()[0]:.2f}")


# ---- main --------------------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEMO_MODEL, help="conf/model/ file, e.g. prithvi_300m_tl_flood")
    parser.add_argument("--checkpoint", type=Path, help="its weights (model.checkpoint); where the file does not "
                        "exist, random bf16 weights are written there first (real_scale.py's layout)")
    parser.add_argument("--items", type=int, default=12, help="items in the collection, all found by the search")
    parser.add_argument("--side", type=int, default=1024, help="each scene's pixels a side")
    parser.add_argument("--dtype", default="auto", help="engine.dtype of the workers")
    parser.add_argument("--quick", action="store_true", help=f"a smoke run: {DEMO_MODEL}, 4 items of 256²")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(json.loads(args.worker), args.threads)
    if args.quick:
        args.model, args.checkpoint, args.items, args.side = DEMO_MODEL, None, 4, 256
    if args.items < 2:
        parser.error("--items: at least 2 (one for each of the two workers)")
    if args.checkpoint is None and args.model != DEMO_MODEL:
        parser.error(f"--model {args.model} needs --checkpoint PATH")
    if args.checkpoint is not None and not args.checkpoint.exists():
        from real_scale import build_prithvi

        print(f"writing {args.checkpoint} ...", file=sys.stderr, flush=True)
        args.checkpoint.parent.mkdir(parents=True, exist_ok=True)
        build_prithvi(args.checkpoint, args.model)
    from tests.geo.hls import RangeServer
    from tests.geo.stac_catalog import COLLECTION, collection
    from tests.stac_api import StacApi, unavailable

    reason = unavailable()
    if reason:
        sys.exit(f"region_search: no STAC API: {reason}")
    with tempfile.TemporaryDirectory(prefix="region-search-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "cogs").mkdir()
        with RangeServer(tmp / "cogs") as cogs, StacApi() as api:
            items = write_items(tmp / "cogs", cogs.url, args.items, args.side)
            api.load(collection(items), items)
            keys = ["pipeline=prithvi_flood", f"model={args.model}", f"engine.dtype={args.dtype}",
                    *([f"model.checkpoint={args.checkpoint.resolve()}"] if args.checkpoint else []),
                    f"search.url={api.url}", f"search.collections=[{COLLECTION}]"]
            cpus = os.cpu_count() or 1
            one = run_workers([[*keys, f"output={tmp}/one/"]], cpus, tmp)
            shared = [*keys, f"output={tmp}/two/", "search.shares=2"]
            two = run_workers([[*shared, f"search.share={i}"] for i in range(2)], max(1, cpus // 2), tmp)
            rows = [row(1, one, one[0]["region_s"]), row(2, two, assemble_seconds(shared))]
    if sum(r["items"] for r in two) != args.items or one[0]["items"] != args.items:
        sys.exit(f"region_search: {args.items} items in the collection, mapped: {one[0]['items']} by one worker, "
                 f"{[r['items'] for r in two]} by the shares")
    print(heading(args, args.model))
    table(["workers", "threads each", "dtype", "items", "load s", "wall s", "items/min",
                 "outside the model (max)", "region s"], rows)


if __name__ == "__main__":
    main()
