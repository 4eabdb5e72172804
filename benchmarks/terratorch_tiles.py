#!/usr/bin/env python
"""terratorch's tiled inference against our flood pipeline: one checkpoint, scene, tiling and thread count.

    .venv/bin/python benchmarks/terratorch_tiles.py --terratorch-python /tmp/tt-venv/bin/python
                      # 300M-TL flood model, 2048² and 4096² scenes, fp32 and bf16, tile 512, overlap 64
    .venv/bin/python benchmarks/terratorch_tiles.py --terratorch-python /tmp/tt-venv/bin/python \\
        --model prithvi_tiny_tl_flood --sizes 1024 --dtypes float32        # a smoke run

terratorch is never a dependency: its side runs under --terratorch-python, a throwaway environment made as
scripts/make_prithvi_golden.py says (torch, torchvision, then `pip install terratorch`).

Built once into --dir (kept between runs):
- `<model>.pt`: the model of conf/model/<model>.yaml built by terratorch's EncoderDecoderFactory as the
  Sen1Floods11 fine-tune is (SelectIndices, ReshapeTokensToImage, LearnedInterpolateToPyramidal, UperNet),
  its weights seeded as the parity fixture's are (make_prithvi_golden.randomize: logits of order 1, so
  that both classes occur), saved as a Lightning checkpoint (`state_dict`, `model.` keys). Both sides
  load this file.
- `scene_<side>.tif`: a synthetic 6-band HLS-like scene (scripts/synthetic_scenes.py).

Measured, per scene size and dtype, each system in its own child process (so each peak RSS is its own;
every child reports its VmHWM as it exits), with torch.set_num_threads(--threads) and OMP_NUM_THREADS:
- terratorch: build the model and load the checkpoint (load s), then, timed: read the GeoTIFF (rasterio),
  scale, nodata to 0, normalise, `terratorch.tasks.tiled_inference.tiled_inference` (crop = tile,
  stride = tile - overlap, batch_size = --batch, cosine-ramp blending), argmax, write the uint8 mask.
  Its border crop and padding are off (delta=0, padding=False; defaults 8 and reflect): with them its
  chips sit 8 pixels off ours and see other context, so the two would run different forwards (the same
  number of them); without them its chips are our tiles. bf16 (--terratorch-bf16): torch.autocast by
  default, as Lightning's `bf16-mixed` runs it; `cast` casts model, input and coordinates to bfloat16,
  which rounds the TL coordinates (2023 becomes 2024) and moves its map off its fp32 one.
- ours: the flood pipeline (`appliance run pipeline=prithvi_flood`'s stages in process) with the same
  tile size, overlap, engine.max_batch_size and engine.dtype; setup is load s, the run is timed.
Both get the scene's date and centre (lat, lon) as the TL models' coordinates. tiles/s counts for both
the tiles our plan lays over the scene (stage `tile`, plan.py); `chips run` is what terratorch ran.
Agreement of the two masks, over pixels with a class in both: where one tile covers a pixel both sides
argmax that tile's logits (expect ~100 % at fp32); in overlaps the blending weights differ (ours ramp
over each actual overlap, terratorch's over tile - stride), so pixels the tiles disagree on may flip.
No warm-up on either side: one cold run each, as a user runs it.
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DATE = "2023-07-01"  # the scenes' acquisition date, given to both sides
NODATA_OUT = 255
# terratorch's registered backbone per conf/model file (its architecture is overridden from ours anyway)
BACKBONES = {"prithvi_300m_tl_flood": "prithvi_eo_v2_300_tl", "prithvi_tiny_tl_flood": "prithvi_eo_v2_tiny_tl",
             "prithvi_100m_flood": "prithvi_eo_v2_100", "prithvi_600m_tl_flood": "prithvi_eo_v2_600_tl"}


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def peak_rss_mib() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) / 1024
    return float("nan")


# ---- terratorch's side (runs under --terratorch-python: no project imports) --------------------------

def terratorch_model(spec: dict):
    from terratorch.models.encoder_decoder_factory import EncoderDecoderFactory

    p = spec["prithvi"]
    return EncoderDecoderFactory().build_model(
        task="segmentation", backbone=BACKBONES[spec["model"]], backbone_pretrained=False,
        backbone_bands=spec["bands"], backbone_embed_dim=p["embed_dim"], backbone_depth=p["depth"],
        backbone_num_heads=p["num_heads"], backbone_coords_encoding=list(p["coords_encoding"]),
        backbone_coords_scale_learn=p["coords_scale_learn"],
        necks=[{"name": "SelectIndices", "indices": list(p["selected_indices"])}, {"name": "ReshapeTokensToImage"},
               {"name": "LearnedInterpolateToPyramidal"}],
        decoder="UperNetDecoder", decoder_channels=p["decoder_channels"], head_dropout=0.1,
        num_classes=p["num_classes"], rescale=True)


def child_build(spec: dict) -> dict:
    import torch

    golden = load_script("make_prithvi_golden")
    torch.manual_seed(golden.SEED)
    model = terratorch_model(spec).eval()
    golden.randomize(model, torch.Generator().manual_seed(golden.SEED))
    state = {f"model.{k}": (v.half() if v.is_floating_point() else v) for k, v in model.state_dict().items()}
    torch.save({"state_dict": state, "epoch": 0, "global_step": 0}, spec["checkpoint"])
    return {"parameters": sum(t.numel() for t in model.parameters())}


def read_normalized(path: str, geo: dict):
    """float32 [C, H, W] as the fine-tune was trained on (DN x scale, nodata 0, then (x - mean) / std),
    the nodata mask, and the profile for the output."""
    import rasterio

    with rasterio.open(path) as ds:
        dn = ds.read()
        nodata = (dn == ds.nodata).any(axis=0) if ds.nodata is not None else np.zeros(dn.shape[1:], bool)
        profile = dict(driver="GTiff", width=ds.width, height=ds.height, count=1, dtype="uint8",
                       nodata=NODATA_OUT, crs=ds.crs, transform=ds.transform, compress="deflate")
    x = dn.astype(np.float32) * geo["scale"]
    x[:, nodata] = 0.0
    x -= np.asarray(geo["means"], np.float32)[:, None, None]
    x /= np.asarray(geo["stds"], np.float32)[:, None, None]
    return x, nodata, profile


def child_terratorch(spec: dict) -> dict:
    from importlib.metadata import version

    import rasterio
    import torch
    from terratorch.tasks.tiled_inference import tiled_inference

    torch.set_num_threads(spec["threads"])
    autocast = spec["dtype"] == "bfloat16" and spec["terratorch_bf16"] == "autocast"
    dtype = torch.float32 if autocast else getattr(torch, spec["dtype"])  # of the weights, input and coords
    start = time.perf_counter()
    model = terratorch_model(spec)
    state = torch.load(spec["checkpoint"], map_location="cpu", weights_only=True)["state_dict"]
    model.load_state_dict({k.removeprefix("model."): v for k, v in state.items()}, strict=True)
    model = model.to(dtype).eval()
    load_s = time.perf_counter() - start
    coords = {}
    if "time" in spec["prithvi"]["coords_encoding"]:
        coords["temporal_coords"] = torch.tensor([[spec["temporal"]]], dtype=dtype)  # [1, T=1, 2]
    if "location" in spec["prithvi"]["coords_encoding"] and spec["centre"]:
        coords["location_coords"] = torch.tensor([spec["centre"]], dtype=dtype)  # [1, 2]
    chips = 0

    def model_forward(x):
        nonlocal chips
        chips += len(x)
        return model(x, **{k: v.expand(len(x), *v.shape[1:]) for k, v in coords.items()}).output

    start = time.perf_counter()
    x, nodata, profile = read_normalized(spec["scene"], spec["geo"])
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = tiled_inference(model_forward, torch.from_numpy(x)[None].to(dtype), crop=spec["tile"],
                                 stride=spec["tile"] - spec["overlap"], batch_size=spec["batch"], delta=0,
                                 padding=False)  # its chips are then our tiles (module docstring)
    mask = logits[0].argmax(0).numpy().astype(np.uint8)
    mask[nodata] = NODATA_OUT
    with rasterio.open(spec["output"], "w", **profile) as dst:
        dst.write(mask[None])
    run_s = time.perf_counter() - start
    return {"load_s": load_s, "run_s": run_s, "chips": chips, "rss_mib": peak_rss_mib(),
            "version": f"terratorch {version('terratorch')}, torch {torch.__version__}"}


# ---- our side (the project's python) -----------------------------------------------------------------

def our_overrides(spec: dict) -> list:
    return ["pipeline=prithvi_flood", f"model={spec['model']}", f"model.checkpoint={spec['checkpoint']}",
            f"pipeline.stages.tile.tile_size={spec['tile']}", f"pipeline.stages.tile.overlap={spec['overlap']}",
            f"engine.max_batch_size={spec['batch']}", f"engine.dtype={spec['dtype']}"]


def child_ours(spec: dict) -> dict:
    import re

    import torch

    from appliance.config.compose import compose
    from appliance.stages.build import build_pipeline

    torch.set_num_threads(spec["threads"])
    pipeline = build_pipeline(compose(our_overrides(spec)))
    pipeline.check()
    start = time.perf_counter()
    pipeline.setup()
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    record = {"input": spec["scene"], "output": spec["output"], "overwrite": True, "date": DATE}
    display = list(pipeline.run([record]))[0]["display"]
    run_s = time.perf_counter() - start
    pipeline.close()
    return {"load_s": load_s, "run_s": run_s, "chips": int(re.search(r", (\d+) tiles?,", display).group(1)),
            "rss_mib": peak_rss_mib(), "version": f"torch {torch.__version__}"}


CHILDREN = {"build": child_build, "terratorch": child_terratorch, "ours": child_ours}


def run_child(python: str, kind: str, spec: dict) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(spec["threads"])}
    if python == sys.executable:  # ours: this checkout's package; terratorch's environment gets none of it
        env["PYTHONPATH"] = str(REPO)
    else:
        env.pop("PYTHONPATH", None)
    result = subprocess.run([python, __file__, "--child", kind, json.dumps(spec)], capture_output=True, text=True,
                            env=env)
    if result.returncode != 0:
        raise RuntimeError(f"{kind} child exited {result.returncode}:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


# ---- the parent --------------------------------------------------------------------------------------

def base_spec(args) -> dict:
    from omegaconf import OmegaConf

    from appliance.config.compose import compose
    from appliance.stages.geo.tile import TileOptions, effective_stride

    model = compose(["pipeline=prithvi_flood", f"model={args.model}"]).model
    tile = args.tile or model.geo.tile_size
    overlap = tile - effective_stride(TileOptions(tile_size=tile, overlap=args.overlap), tile)  # the stage's rule
    day = date.fromisoformat(DATE).timetuple().tm_yday
    return {"model": args.model, "prithvi": OmegaConf.to_container(model.prithvi), "bands": list(model.geo.bands),
            "geo": {"scale": model.geo.scale, "means": list(model.geo.means), "stds": list(model.geo.stds)},
            "tile": tile, "overlap": overlap, "batch": args.batch, "threads": args.threads,
            "terratorch_bf16": args.terratorch_bf16,
            "temporal": [int(DATE[:4]), day], "checkpoint": str(args.dir / f"{args.model}.pt")}


def scene(args, side: int) -> Path:
    path = args.dir / f"scene_{side}.tif"
    if not path.exists():
        load_script("synthetic_scenes").write_scene(path, side, side, seed=1)
    return path


def scene_centre(path: Path):
    import rasterio

    from appliance.stages.geo.acquisition import scene_centre as centre

    with rasterio.open(path) as ds:
        return centre(ds.crs, ds.transform, ds.width, ds.height)


def agreement(ours: Path, theirs: Path, plan) -> str:
    """Where both masks have a class: the share that agrees, over pixels one tile covers (the same logits on
    both sides) and over overlaps (blended with different weights); and the share of water in ours."""
    import rasterio

    with rasterio.open(ours) as a, rasterio.open(theirs) as b:
        x, y = a.read(1), b.read(1)
    covers = np.zeros(x.shape, np.int32)
    for t in plan.tiles():
        covers[t.y:t.y + t.height, t.x:t.x + t.width] += 1
    valid = (x != NODATA_OUT) & (y != NODATA_OUT)
    single, overlap = valid & (covers == 1), valid & (covers > 1)
    same = x == y
    nodata = ((x == NODATA_OUT) == (y == NODATA_OUT)).mean()
    def share(where):
        return f"{same[where].mean():.2%}" if where.any() else "no pixels in"

    return (f"{share(single)} one tile, {share(overlap)} overlaps "
            f"(nodata {nodata:.2%}, water {(x[valid] == 1).mean():.0%})")


def table(header, rows) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    def line(cells):
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


BF16_WAYS = {"autocast": "torch.autocast, fp32 weights", "cast": "model, input and coordinates cast"}
HEADER = ["system", "dtype", "scene", "tiles", "chips run", "load s", "run s", "tiles/s", "ours / terratorch",
          "peak RSS MiB", "argmax agreement"]


def measure(args, spec: dict, side: int, dtype: str) -> dict:
    """Both systems on one scene in one dtype: each one's child result and its table row."""
    from appliance.stages.geo.plan import TilePlan

    path = scene(args, side)
    plan = TilePlan(side, side, spec["tile"], spec["tile"] - spec["overlap"])
    run = {**spec, "scene": str(path), "centre": scene_centre(path), "dtype": dtype}
    results, masks = {}, {}
    for system, python in (("terratorch", args.terratorch_python), ("ours", sys.executable)):
        masks[system] = args.dir / f"mask_{system}_{side}_{dtype}.tif"
        results[system] = run_child(python, system, {**run, "output": str(masks[system])})
        print(f"{system} {side}² {dtype}: {json.dumps(results[system])}", file=sys.stderr, flush=True)
    if results["ours"]["chips"] != plan.count:
        raise RuntimeError(f"our pipeline ran {results['ours']['chips']} tiles where the plan has {plan.count}")
    rate = {system: plan.count / r["run_s"] for system, r in results.items()}
    agree = agreement(masks["ours"], masks["terratorch"], plan)
    for system, r in results.items():
        ours = system == "ours"
        r["row"] = [system, dtype, f"{side}²", plan.count, r["chips"], f"{r['load_s']:.1f}", f"{r['run_s']:.1f}",
                    f"{rate[system]:.3f}", f"**{rate['ours'] / rate['terratorch']:.2f}x**" if ours else "",
                    f"{r['rss_mib']:.0f}", agree if ours else ""]
    return results


def heading(args, spec: dict, versions: dict) -> str:
    from real_scale import NATIVE_FLAGS  # benchmarks/ is sys.path[0] when this script runs

    from appliance.engine.host import Host

    flags = " ".join(f for f in NATIVE_FLAGS if f in Host.read().cpu_flags) or "none of " + " ".join(NATIVE_FLAGS)
    return (f"`{Path(sys.executable).name} benchmarks/terratorch_tiles.py {' '.join(sys.argv[1:])}`, {date.today()};"
            f" CPU flags: {flags}; {os.cpu_count()} CPUs, {args.threads} threads; model {args.model} (random "
            f"weights, checkpoint built by terratorch); tile {spec['tile']}, stride {spec['tile'] - spec['overlap']} "
            f"(overlap {spec['overlap']}), batch {args.batch}; {versions['terratorch']} (delta 0, no padding; bf16: "
            f"{BF16_WAYS[args.terratorch_bf16]}); ours on {versions['ours']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--terratorch-python", help="python of an environment with terratorch installed")
    ap.add_argument("--model", default="prithvi_300m_tl_flood", choices=sorted(BACKBONES), help="conf/model/ file")
    ap.add_argument("--sizes", default="2048,4096", help="square scene sides, comma-separated")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated: float32,bfloat16")
    ap.add_argument("--tile", type=int, default=None, help="tile (terratorch's crop); default model.geo.tile_size")
    ap.add_argument("--overlap", type=int, default=None, help="default tile // 8 (the tile stage's default)")
    ap.add_argument("--batch", type=int, default=8, help="tiles a forward: engine.max_batch_size, its batch_size")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads on both sides")
    ap.add_argument("--terratorch-bf16", choices=("autocast", "cast"), default="autocast",
                    help="terratorch's bf16: torch.autocast (Lightning's bf16-mixed), or model, input and coordinates "
                    "cast (which rounds the TL coordinates: 2023 becomes 2024)")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/terratorch-tiles"), help="checkpoint and scenes (kept)")
    ap.add_argument("--child", nargs=2, metavar=("KIND", "SPEC"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(CHILDREN[args.child[0]](json.loads(args.child[1]))))
        return
    if not args.terratorch_python:
        ap.error("--terratorch-python is required (a python with terratorch; see the docstring)")
    sys.path.insert(0, str(REPO))
    started = time.perf_counter()
    args.dir.mkdir(parents=True, exist_ok=True)
    spec = base_spec(args)
    if not Path(spec["checkpoint"]).exists():
        built = run_child(args.terratorch_python, "build", spec)
        print(f"built {spec['checkpoint']} with terratorch: {built['parameters'] / 1e6:.0f}M parameters",
              file=sys.stderr)
    rows, rss, versions = [], {}, {}
    for side in [int(s) for s in args.sizes.split(",")]:
        for dtype in args.dtypes.split(","):
            for system, r in measure(args, spec, side, dtype).items():
                rows.append(r["row"])
                versions[system], rss[system, dtype, side] = r["version"], r["rss_mib"]
    print("\n" + heading(args, spec, versions) + "\n")
    print(table(HEADER, rows))
    print("\ngoal (issue #56): ours / terratorch >= 1.5x in fp32 and in bf16; peak RSS flat in the scene size")
    sides = sorted({s for _, _, s in rss})
    if len(sides) > 1:
        growth = [f"{system} {dtype} {rss[system, dtype, sides[-1]] / rss[system, dtype, sides[0]]:.2f}x"
                  for system, dtype, s in rss if s == sides[0]]
        print(f"\npeak RSS {sides[-1]}² / {sides[0]}²: " + ", ".join(growth))
    print(f"\n({time.perf_counter() - started:.0f} s in all)")


if __name__ == "__main__":
    main()
