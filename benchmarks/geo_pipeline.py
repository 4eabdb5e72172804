#!/usr/bin/env python
"""The flood pipeline against the bare model and a naive loop (tiles/s), and its peak RSS as scenes grow.

    python benchmarks/geo_pipeline.py              # tiny-TL, tile 224, batch 8: 4x4 tiles; RSS on 1024^2, 2048^2
    python benchmarks/geo_pipeline.py --quick      # a smoke run: 2x2 tiles, RSS on 256^2 and 512^2
    python benchmarks/geo_pipeline.py --dtypes float32,bfloat16 --profile
    python benchmarks/geo_pipeline.py --pipeline prithvi_crops --model prithvi_300m_tl_crops   # 3 dates a tile

Speed, in one process, on the same synthetic scene of GRID x GRID tiles (side = GRID x tile, so the
tiles are the same with stride = tile), --repeat interleaved rounds (best and median reported):
- bare:     the model's forward on the scene's tiles, pre-made as [batch, C, T, T] tensors;
- pipeline: `build_pipeline(compose(pipeline=prithvi_flood ...))` with stride = tile: read, tile,
            normalize, engine (pool), stitch, write; overhead = (t_pipeline - t_bare) / t_bare per tile;
- default:  the same pipeline with its default overlap (tile // 8): more tiles, the shipped setting;
- naive:    as the reference does it: read the whole raster, cut non-overlapping tiles, one forward
            per tile, write the whole mask at the end.
A model of T > 1 dates (`--pipeline prithvi_crops`) reads the scene as each of its T dates (pre-made
batches [batch, C, T, S, S]); the naive loop, one date, is left out for it.
Every forward goes through a timer, so each run also reports its time outside the model: the
overhead measured within one run, which load from other processes skews far less than two runs.
Peak RSS (a child per run): `appliance run pipeline=prithvi_flood` and the naive loop on a scene of
--rss-side pixels square and on one 4x its area (2x each side). Each child prints its own VmHWM as
it exits. Keep S at several batches of tiles: below that the peak follows the batch's activations,
not the scene. The model has random weights: speed and memory do not depend on them.
"""
import argparse
import cProfile
import importlib.util
import os
import pstats
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np
import rasterio
import torch

REPO = Path(__file__).resolve().parents[1]
DATES = ("2023-04-15", "2023-07-01", "2023-09-15")  # the scenes' acquisition dates (TL models encode them)
sys.path.insert(0, str(REPO))

from appliance.config.compose import compose
from appliance.engine.models.prithvi import build_prithvi_segmentation, load_prithvi, save_safetensors
from appliance.stages.build import build_pipeline
from appliance.stages.geo.multidate import model_frames


def load_synthetic():
    spec = importlib.util.spec_from_file_location("synthetic_scenes", REPO / "scripts" / "synthetic_scenes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def overrides(args, checkpoint, dtype, stride=None):
    out = [f"pipeline={args.pipeline}", f"model={args.model}", f"model.checkpoint={checkpoint}",
           f"pipeline.stages.tile.tile_size={args.tile}", f"engine.max_batch_size={args.batch}",
           f"engine.dtype={dtype}"]
    return out + ([f"pipeline.stages.tile.stride={stride}"] if stride else [])


def frames_of(args) -> int:
    """T: the dates each tile carries (the pipeline's own rule, multidate.model_frames)."""
    return model_frames(compose([f"pipeline={args.pipeline}", f"model={args.model}"]))


def scene_input(scene, frames: int):
    """`input` for one scene: the file, or for a T-date model the same file as each of its T dates."""
    return str(scene) if frames == 1 else [str(scene)] * frames


def make_checkpoint(args, directory: Path) -> Path:
    cfg = compose([f"pipeline={args.pipeline}", f"model={args.model}"])
    torch.manual_seed(0)
    model = build_prithvi_segmentation(cfg.model.prithvi, in_chans=len(cfg.model.geo.bands))
    path = directory / f"{args.model}.safetensors"
    save_safetensors(model, path)
    return path


def read_normalized(path, geo):
    """The whole scene as the model sees it: (float32 [C, H, W] normalised, nodata bool [H, W])."""
    with rasterio.open(path) as ds:
        dn = ds.read()
        nodata = (dn == ds.nodata).any(axis=0) if ds.nodata is not None else np.zeros(dn.shape[1:], bool)
    x = dn.astype(np.float32) * geo.scale
    del dn
    x[:, nodata] = 0.0  # nodata_fill, before normalising as the pipeline does
    x -= np.asarray(geo.means, np.float32)[:, None, None]
    x /= np.asarray(geo.stds, np.float32)[:, None, None]
    return x, nodata


def naive_loop(scene, output, model, geo, tile, dtype):
    """The reference's way: whole raster in memory, non-overlapping tiles, one forward each, one write."""
    x, nodata = read_normalized(scene, geo)
    _, h, w = x.shape
    ph, pw = -h % tile, -w % tile
    if ph or pw:
        x = np.pad(x, ((0, 0), (0, ph), (0, pw)), mode="reflect")
    mask = np.empty(x.shape[1:], np.uint8)
    with torch.inference_mode():
        for y in range(0, x.shape[1], tile):
            for x0 in range(0, x.shape[2], tile):
                batch = torch.from_numpy(x[None, :, y:y + tile, x0:x0 + tile]).to(dtype)
                mask[y:y + tile, x0:x0 + tile] = model(batch)[0].argmax(0).numpy()
    mask = mask[:h, :w]
    mask[nodata] = 255
    with rasterio.open(scene) as src:
        profile = dict(driver="GTiff", width=w, height=h, count=1, dtype="uint8", nodata=255,
                       crs=src.crs, transform=src.transform, compress="deflate")
    with rasterio.open(output, "w", **profile) as dst:
        dst.write(mask[None])
    return (x.shape[1] // tile) * (x.shape[2] // tile)


def bare_coords(model_cfg, frames: int, batch: int) -> dict:
    """The coordinates a TL model's forward gets in the pipeline (shape and kind; the values do not change
    the cost): DATES and a place, for `batch` tiles; none for a model without coords_encoding."""
    encodings = set(model_cfg.prithvi.get("coords_encoding") or [])
    days = [[float(d[:4]), float(date.fromisoformat(d).timetuple().tm_yday)] for d in DATES[:frames]]
    out = {}
    if "time" in encodings:
        out["temporal_coords"] = torch.tensor(days).expand(batch, -1, -1)
    if "location" in encodings:
        out["location_coords"] = torch.tensor([[45.0, 10.0]]).expand(batch, -1)
    return out


def premade_batches(scene, geo, tile, batch, dtype, frames):
    """The scene's tiles as the engine batches them: [B, C, S, S], or [B, C, T, S, S] for T dates."""
    x, _ = read_normalized(scene, geo)
    tiles = [torch.from_numpy(x[:, y:y + tile, x0:x0 + tile].copy())
             for y in range(0, x.shape[1], tile) for x0 in range(0, x.shape[2], tile)]
    if frames > 1:
        tiles = [t[:, None].expand(-1, frames, -1, -1).contiguous() for t in tiles]
    return [torch.stack(tiles[i:i + batch]).to(dtype) for i in range(0, len(tiles), batch)]


def ready_pipeline(cfg):
    pipeline = build_pipeline(cfg)
    pipeline.check()
    pipeline.setup()
    return pipeline


def run_pipeline(pipeline, scene, output, frames):
    record = {"input": scene_input(scene, frames), "output": str(output), "overwrite": True,
              "date": DATES[0] if frames == 1 else list(DATES[:frames])}  # TL models run their time encoding
    records = list(pipeline.run([record]))
    return int(records[0]["display"].split(", ")[1].split()[0])  # "wrote m.tif: WxH, N tiles, ..."


class ForwardTimer:
    """Stands in for the model (same call); `seconds` sums the time spent inside its forwards."""

    def __init__(self, model):
        self.model, self.seconds = model, 0.0

    def __call__(self, x, **coords):
        start = time.perf_counter()
        out = self.model(x, **coords)
        self.seconds += time.perf_counter() - start
        return out


def timed_engine_model(pipeline) -> ForwardTimer:
    engine = next(s for s in pipeline.stages if s.name == "engine").engine
    engine.model = ForwardTimer(engine.model)  # PoolEngine only calls it
    return engine.model


def speed_rows(args, checkpoint, scene, tmp, dtype_name):
    dtype = getattr(torch, dtype_name)
    tight = ready_pipeline(compose(overrides(args, checkpoint, dtype_name, stride=args.tile)))
    default = ready_pipeline(compose(overrides(args, checkpoint, dtype_name)))
    geo = tight.stages[0].cfg.model.geo
    tight_model, default_model = timed_engine_model(tight), timed_engine_model(default)
    frames = frames_of(args)
    batches = premade_batches(scene, geo, args.tile, args.batch, dtype, frames)
    count = sum(len(b) for b in batches)

    def bare():
        with torch.inference_mode():
            for b in batches:
                tight_model(b, **bare_coords(tight.stages[0].cfg.model, frames, len(b)))
        return count

    runs = {  # name: (run, the timer its forwards go through)
        "bare forward (pre-made batches)": (bare, tight_model),
        "pipeline, stride = tile": (lambda: run_pipeline(tight, scene, tmp / "tight.tif", frames), tight_model),
        "pipeline, default overlap": (lambda: run_pipeline(default, scene, tmp / "default.tif", frames),
                                      default_model),
    }
    if frames == 1:  # the naive loop reads one date
        runs["naive loop (reference-like)"] = (
            lambda: naive_loop(scene, tmp / "naive.tif", tight_model, geo, args.tile, dtype), tight_model)
    seconds, outside, tiles = {name: [] for name in runs}, {name: [] for name in runs}, {}
    bare()  # warm-up: allocator, oneDNN primitives
    for _ in range(args.repeat):  # interleaved, so that load from other processes hits every variant alike
        for name, (fn, timer) in runs.items():
            timer.seconds = 0.0
            start = time.perf_counter()
            tiles[name] = fn()
            seconds[name].append(time.perf_counter() - start)
            outside[name].append(seconds[name][-1] - timer.seconds)
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(run_pipeline, tight, scene, tmp / "tight.tif", frames)
        print(f"\ncProfile of one pipeline run (stride = tile, {dtype_name}), top 25 by cumulative time:")
        pstats.Stats(profiler, stream=sys.stdout).sort_stats("cumulative").print_stats(25)
    tight.close()
    default.close()
    assert tiles["pipeline, stride = tile"] == count, (tiles, count)
    side, bare_name = args.grid * args.tile, "bare forward (pre-made batches)"

    def vs_bare(name, pick):  # per tile, so that the overlap run (more tiles) compares too
        if name == bare_name:
            return ""
        ours, bare_ = pick(seconds[name]) / tiles[name], pick(seconds[bare_name]) / count
        return f"{(ours - bare_) / bare_:+.1%}"

    rows = []
    for name in runs:
        best, median = min(seconds[name]), statistics.median(seconds[name])
        out = statistics.median(outside[name])
        rows.append([name, dtype_name, tiles[name], f"{best:.2f}", f"{median:.2f}", f"{tiles[name] / median:.2f}",
                     f"{side * side / median / 1e6:.3f}", vs_bare(name, min), vs_bare(name, statistics.median),
                     f"{out:.2f} ({out / (median - out):.1%})"])
    return rows


# The child reports its own VmHWM as it exits. ru_maxrss from wait4 would not do: exec keeps the
# parent's high-water mark (the kernel folds the old mm's into the child's maxrss), so every child
# would read as big as this process.
PRINT_HWM = "print([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].strip(), file=sys.stderr)"
CLI_WITH_HWM = f"import sys; from appliance.cli import main; code = main(sys.argv[1:]); {PRINT_HWM}; sys.exit(code)"


def peak_rss_mib(argv, threads):
    """Run `argv` (a child that prints its VmHWM line at exit); its peak RSS in MiB."""
    env = {**os.environ, "PYTHONPATH": str(REPO), **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    result = subprocess.run(argv, capture_output=True, text=True, env=env)
    found = re.search(r"VmHWM:\s+(\d+) kB", result.stderr)
    if result.returncode != 0 or not found:
        raise RuntimeError(f"{argv[:5]} exited {result.returncode}:\n{result.stderr[-3000:]}")
    return int(found.group(1)) / 1024


def rss_rows(args, checkpoint, synthetic, tmp, dtype_name):
    side = args.rss_side
    scenes = {"S": (side, side), "4S (2x each side)": (2 * side, 2 * side)}
    rows, peaks = [], {}
    for label, (h, w) in scenes.items():
        scene = synthetic.write_scene(tmp / f"rss_{h}x{w}.tif", h, w, seed=2)
        frames = frames_of(args)
        given = scene if frames == 1 else "[" + ",".join([str(scene)] * frames) + "]"
        cli = [sys.executable, "-c", CLI_WITH_HWM, "run", f"input={given}", f"output={tmp}/rss_out.tif",
               "overwrite=true", *overrides(args, checkpoint, dtype_name)]
        naive = [sys.executable, __file__, "--naive-child", str(scene), str(tmp / "rss_naive.tif"), str(checkpoint),
                 "--model", args.model, "--tile", str(args.tile), "--dtypes", dtype_name,
                 *(["--threads", str(args.threads)] if args.threads else [])]
        for run, argv in (("pipeline (appliance run)", cli), ("naive loop", naive))[:1 if frames > 1 else 2]:
            peaks[run, label] = peak = peak_rss_mib(argv, args.threads)
            growth = ["", ""] if label == "S" else [f"{peak / peaks[run, 'S']:.2f}x", f"{peak - peaks[run, 'S']:+.0f}"]
            rows.append([run, label, f"{h}x{w}", f"{peak:.0f}", *growth])
    return sorted(rows, key=lambda r: r[0], reverse=True)


def table(header, rows):
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    def line(cells):
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"
    print("\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)]))


def naive_child(args):
    scene, output, checkpoint = args.naive_child
    cfg = compose(["pipeline=prithvi_flood", f"model={args.model}", f"model.checkpoint={checkpoint}"])
    dtype = getattr(torch, args.dtypes)
    model = load_prithvi(cfg.model).to(dtype)
    naive_loop(scene, output, model, cfg.model.geo, args.tile, dtype)
    print([line for line in open("/proc/self/status") if line.startswith("VmHWM")][0].strip(), file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipeline", default="prithvi_flood",
                        help="conf/pipeline/ file: prithvi_flood, prithvi_crops ...")
    parser.add_argument("--model", default="prithvi_tiny_tl_flood", help="conf/model/ file (random weights)")
    parser.add_argument("--tile", type=int, default=224)
    parser.add_argument("--batch", type=int, default=8, help="engine.max_batch_size, and the bare batches")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default); "
                        "1 is faster on cores other processes share")
    parser.add_argument("--grid", type=int, default=4, help="speed scene: GRID x GRID tiles")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds; the best time counts")
    parser.add_argument("--rss-side", type=int, default=1024, help="scene S is this square; 4S is twice each side")
    parser.add_argument("--dtypes", default="float32", help="comma-separated: float32,bfloat16")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--skip-rss", action="store_true")
    parser.add_argument("--profile", action="store_true", help="cProfile one pipeline run, top 25 cumulative")
    parser.add_argument("--quick", action="store_true", help="grid 2, repeat 1, RSS on 256^2 and 512^2")
    parser.add_argument("--naive-child", nargs=3, metavar=("SCENE", "OUT", "CKPT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.naive_child:
        return naive_child(args)
    if args.quick:
        args.grid, args.repeat, args.rss_side = 2, 1, 256
    synthetic = load_synthetic()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.2f}; pipeline {args.pipeline}, model {args.model} "
          f"({frames_of(args)} date(s) a tile), tile {args.tile}, batch {args.batch}")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        checkpoint = make_checkpoint(args, tmp)
        side = args.grid * args.tile
        scene = synthetic.write_scene(tmp / "speed.tif", side, side, seed=1)
        for dtype_name in args.dtypes.split(","):
            if not args.skip_speed:
                print(f"\nSpeed: {side}x{side} scene ({args.grid}x{args.grid} tiles of {args.tile}), "
                      f"{args.repeat} interleaved rounds")
                table(["run", "dtype", "tiles", "best s", "median s", "tiles/s", "Mpx/s", "vs bare (best)",
                       "vs bare (median)", "outside the model: s (% of model)"],
                      speed_rows(args, checkpoint, scene, tmp, dtype_name))
            if not args.skip_rss:
                print(f"\nPeak RSS, {dtype_name}, pipeline with its default overlap, naive loop without:")
                table(["run", "scene", "pixels", "peak MiB", "4S / S", "4S - S MiB"],
                      rss_rows(args, checkpoint, synthetic, tmp, dtype_name))
    print(f"\nload {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
