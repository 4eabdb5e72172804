"""Images/s of our CLIP (and LLaVA-NeXT anyres) preprocessing vs transformers' image processors.

    .venv/bin/python benchmarks/image_preprocess.py [--count 32] [--rounds 5] [--workers 2]

Same inputs for every row: `--count` photo-like 1024x768 RGB images (gradients + noise), already
decoded (decoding is the same work for both sides). Each row reports the best of `--rounds` passes
over all images; "x" is the speed relative to the matching transformers row. transformers runs its
PIL backend (CLIPImageProcessorPil, LlavaNextImageProcessorPil): the torchvision backend needs
torchvision, which this project does not install. torch runs with 1 intra-op thread so the pool rows
show what the workers add. On a shared machine, run it twice and keep the quieter figures.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from appliance.vision.anyres import anyres_preprocess
from appliance.vision.clip_preprocess import ClipPreprocessConfig, clip_preprocess
from appliance.vision.preprocess_executor import PreprocessExecutor

MEAN, STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
CLIP = {"size": {"shortest_edge": 336}, "crop_size": {"height": 336, "width": 336}, "resample": 3,
        "do_center_crop": True, "image_mean": MEAN, "image_std": STD}
NEXT = {**CLIP, "image_grid_pinpoints": [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]}


def photo_like(seed: int, width: int = 1024, height: int = 768) -> Image.Image:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    phase = rng.uniform(0, 6.28, 3)
    base = np.stack([128 + 100 * np.sin(xx / 41 + yy / 67 + phase[0]), 128 + 90 * np.cos(yy / 31 + phase[1]),
                     255 * (xx + yy) / (width + height) + 20 * np.sin(phase[2])], axis=-1)
    return Image.fromarray((base + rng.normal(0, 18, base.shape)).clip(0, 255).astype(np.uint8))


def rate(fn, images, rounds: int) -> tuple[float, float]:
    """(images/s over the best round by wall clock, CPU ms per image of this process in that round).

    CPU time is the steadier figure on a shared machine; it misses the work of process-pool children."""
    fn(images[:2])  # warm up
    best, cpu = float("inf"), 0.0
    for _ in range(rounds):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn(images)
        wall = time.perf_counter() - start
        if wall < best:
            best, cpu = wall, time.process_time() - start_cpu
    return len(images) / best, 1000 * cpu / len(images)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    from transformers import CLIPImageProcessorPil, LlavaNextImageProcessorPil

    images = [photo_like(i) for i in range(args.count)]
    hf_clip, hf_next = CLIPImageProcessorPil(**CLIP), LlavaNextImageProcessorPil(**NEXT)
    clip_cfg, next_cfg = ClipPreprocessConfig.from_dict(CLIP), ClipPreprocessConfig.from_dict(NEXT)
    fast_cfg = ClipPreprocessConfig.from_dict(CLIP, resize_backend="torch")

    def hf_one(image):
        return hf_clip(image, return_tensors="pt")["pixel_values"][0]

    def hf_next_one(image):
        return hf_next(image, return_tensors="pt")["pixel_values"][0]

    clip_diff = max((clip_preprocess(im, clip_cfg) - hf_one(im)).abs().max().item() for im in images[:8])
    fast_diff = max((clip_preprocess(im, fast_cfg) - hf_one(im)).abs().max().item() for im in images[:8])
    next_diff = max((anyres_preprocess(im, next_cfg).pixel_values - hf_next_one(im)).abs().max().item()
                    for im in images[:4])

    rows = []
    hf_rate = rate(lambda ims: [hf_one(im) for im in ims], images, args.rounds)
    rows.append(("clip", "transformers CLIPImageProcessorPil, 1 image/call", hf_rate, hf_rate))
    rows.append(("clip", "transformers, whole list in one call",
                 rate(lambda ims: hf_clip(ims, return_tensors="pt"), images, args.rounds), hf_rate))
    rows.append(("clip", "ours clip_preprocess, inline",
                 rate(lambda ims: [clip_preprocess(im, clip_cfg) for im in ims], images, args.rounds), hf_rate))
    rows.append(("clip", "ours, resize_backend=torch (not exact), inline",
                 rate(lambda ims: [clip_preprocess(im, fast_cfg) for im in ims], images, args.rounds), hf_rate))
    with PreprocessExecutor(args.workers, "thread") as pool:
        rows.append(("clip", f"transformers in thread pool x{args.workers}",
                     rate(lambda ims: pool.map(hf_one, ims), images, args.rounds), hf_rate))
        rows.append(("clip", f"ours in thread pool x{args.workers}",
                     rate(lambda ims: pool.map(clip_preprocess, ims, [clip_cfg] * len(ims)), images, args.rounds),
                     hf_rate))
    with PreprocessExecutor(args.workers, "process") as pool:
        pool.map(clip_preprocess, images[:args.workers], [clip_cfg] * args.workers)  # start the workers
        rows.append(("clip", f"ours in process pool x{args.workers}",
                     rate(lambda ims: pool.map(clip_preprocess, ims, [clip_cfg] * len(ims)), images, args.rounds),
                     hf_rate))
    few = images[: max(4, args.count // 4)]
    hf_next_rate = rate(lambda ims: [hf_next_one(im) for im in ims], few, args.rounds)
    rows.append(("anyres", "transformers LlavaNextImageProcessorPil", hf_next_rate, hf_next_rate))
    rows.append(("anyres", "ours anyres_preprocess, inline",
                 rate(lambda ims: [anyres_preprocess(im, next_cfg) for im in ims], few, args.rounds), hf_next_rate))

    print(f"{args.count} images 1024x768, best of {args.rounds}, torch threads 1, {os.cpu_count()} CPUs visible")
    print(f"{'':7} {'implementation':48} {'images/s':>9} {'x':>6} {'CPU ms/img':>11}")
    for kind, name, (value, cpu), (base, _) in rows:
        cpu_text = "n/a" if "process pool" in name else f"{cpu:.1f}"
        print(f"{kind:7} {name:48} {value:9.1f} {value / base:6.2f} {cpu_text:>11}")
    print(f"load average during the run: {os.getloadavg()[0]:.2f} (other users of the CPUs slow every row)")
    print(f"max |ours - transformers| (normalised units): clip {clip_diff:.2e}, anyres {next_diff:.2e}, "
          f"clip with resize_backend=torch {fast_diff:.3f}")


if __name__ == "__main__":
    main()
