#!/usr/bin/env python
"""Throughput and peak memory of the geo stages around the model, with a near-free stand-in model.

    python benchmarks/geo_pipeline.py --height 4096 --width 4096 --tile 512 --overlap 64

Prints one JSON line: scene size, tiles, seconds, megapixels/s, tiles/s and the tracemalloc peak
(numpy buffers: tiles, strips) of read -> tile -> normalize -> stand-in -> stitch -> write.
"""
import argparse
import importlib.util
import json
import sys
import tempfile
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import appliance.stages.geo  # noqa: E402,F401  (registers the geo stages)
from appliance.config.schema import AppConfig  # noqa: E402
from appliance.pipeline import Stage, build_pipeline, register_stage  # noqa: E402


@register_stage
class NearFreeLogits(Stage):
    """The engine's contract at almost no cost: water logit = -(normalised NIR + SWIR1)."""

    name = "bench_logits"
    consumes = ("tensor",)
    produces = ("logits",)

    @dataclass
    class Options:
        pass

    def map(self, record):
        x = record["tensor"]
        return {**record, "logits": torch.stack([torch.zeros_like(x[0]), -(x[3] + x[4])])}


def load_synthetic():
    spec = importlib.util.spec_from_file_location("synthetic_scenes", REPO / "scripts" / "synthetic_scenes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--height", type=int, default=2048)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--tile", type=int, default=512)
    parser.add_argument("--overlap", type=int, default=64)
    args = parser.parse_args()
    synthetic = load_synthetic()
    geo = {"bands": list(synthetic.BANDS), "means": [0.14, 0.14, 0.12, 0.31, 0.20, 0.12],
           "stds": [0.074, 0.074, 0.087, 0.118, 0.098, 0.077], "scale": 0.0001, "class_names": ["land", "water"]}
    nodes = [{"stage": "raster_inputs"}, {"stage": "raster_read"},
             {"stage": "tile", "tile_size": args.tile, "overlap": args.overlap}, {"stage": "normalize"},
             {"stage": "bench_logits"}, {"stage": "stitch", "progress": False}, {"stage": "raster_write"}]
    cfg = OmegaConf.merge(OmegaConf.structured(AppConfig), {
        "model": {"name": "bench", "architecture": "Bench", "geo": geo},
        "pipeline": {"name": "geo-bench", "inputs": ["input", "output", "overwrite"], "stages": nodes},
    })
    with tempfile.TemporaryDirectory() as tmp:
        scene = synthetic.write_scene(Path(tmp) / "scene.tif", args.height, args.width, seed=0)
        pipeline = build_pipeline(cfg)
        tracemalloc.start()
        start = time.perf_counter()
        records = list(pipeline.run([{"input": str(scene), "output": tmp + "/out", "overwrite": False}]))
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    tiles = int(records[0]["display"].split(", ")[1].split()[0])
    print(json.dumps({
        "height": args.height, "width": args.width, "tile": args.tile, "overlap": args.overlap,
        "tiles": tiles, "seconds": round(seconds, 3),
        "megapixels_per_s": round(args.height * args.width / seconds / 1e6, 2),
        "tiles_per_s": round(tiles / seconds, 2), "peak_traced_mib": round(peak / 2**20, 1),
    }))


if __name__ == "__main__":
    main()
