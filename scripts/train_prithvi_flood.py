#!/usr/bin/env python
"""Train an embedded demo model on synthetic scenes: flood (conf/model/prithvi_demo_flood.yaml),
with `--target burn_scar` burn scars (conf/model/prithvi_demo_burn_scars.yaml), with `--target crops`
multi-temporal crop classes (conf/model/prithvi_demo_crops.yaml: 3 dates, 13 classes).

The architecture, bands, means/stds and the output path all come from the model config, so the YAML
and the weights cannot drift apart. Scenes come from scripts/synthetic_scenes.py, seeded: training
uses seeds TRAIN_SEED0.. and evaluation uses EVAL_SEEDS, which training never sees. Inputs are
prepared exactly as the pipelines do (raster_read + normalize): reflectance = DN * scale,
nodata pixels set to reflectance 0, then (x - mean) / std; nodata/cloud labels (255) are ignored
by the loss. A multi-date model (model.prithvi.num_frames T > 1) takes the scene's T x C bands (date-major)
as [C, T, H, W], as the tile stage gives it. Writes model.safetensors and metrics.json beside the config's
checkpoint.

    .venv/bin/python scripts/train_prithvi_flood.py                 # the committed weights
    .venv/bin/python scripts/train_prithvi_flood.py --eval-only     # re-score the committed weights
    .venv/bin/python scripts/train_prithvi_flood.py --target burn_scar --steps 400 --pool 80
    .venv/bin/python scripts/train_prithvi_flood.py --target crops --steps 700
    .venv/bin/python scripts/train_prithvi_flood.py --steps 100 --out /tmp/demo model.prithvi.embed_dim=96
"""
import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from appliance.config.compose import compose
from appliance.engine.models.prithvi import build_prithvi_segmentation, load_prithvi, save_safetensors
from synthetic_scenes import NODATA_DN, NODATA_LABEL, make_scene

TRAIN_SEED0 = 10_000
EVAL_SEEDS = (1001, 1002, 1003, 1004, 1005, 1006)
EVAL_SIZES = ((300, 400), (128, 128), (512, 512))
PIPELINE_TILE = 512  # the tile stage's default: smaller scenes are reflect-padded bottom/right to it
MODELS = {"water": "prithvi_demo_flood", "burn_scar": "prithvi_demo_burn_scars",
          "crops": "prithvi_demo_crops"}  # --target -> model config


def model_input(dn: np.ndarray, geo) -> np.ndarray:
    """DN int16 [T x C, H, W] (date-major) -> normalised float32 [C, H, W] for one date, [C, T, H, W] for
    several, as raster_read (nodata_fill 0), tile and normalize do."""
    bands = len(geo.bands)
    x = dn.astype(np.float32) * np.float32(geo.scale)
    x[:, (dn == NODATA_DN).any(axis=0)] = 0.0
    x = x.reshape(-1, bands, *x.shape[1:]).transpose(1, 0, 2, 3)  # [C, T, H, W]
    x -= np.asarray(geo.means, dtype=np.float32)[:, None, None, None]
    x /= np.asarray(geo.stds, dtype=np.float32)[:, None, None, None]
    return np.ascontiguousarray(x[:, 0] if x.shape[1] == 1 else x)


def make_pool(count: int, rng: np.random.Generator, geo, target: str):
    """`count` training scenes of random sizes (96..512 px a side): [(input, labels)], seeds TRAIN_SEED0+i."""
    pool = []
    for i in range(count):
        h, w = (int(v) for v in rng.integers(96, 513, size=2))
        dn, labels = make_scene(h, w, seed=TRAIN_SEED0 + i, target=target)
        pool.append((model_input(dn, geo), labels))
    return pool


def crop(x: np.ndarray, y: np.ndarray, tile: int, rng: np.random.Generator):
    """A random tile x tile window, flipped/rotated at random; a smaller scene is reflect-padded
    bottom/right as the tile stage pads it (padded labels are ignored)."""
    h, w = x.shape[-2:]
    lead = ((0, 0),) * (x.ndim - 2)  # bands (and dates)
    if h < tile or w < tile:
        ph, pw = max(tile - h, 0), max(tile - w, 0)
        x = np.pad(x, (*lead, (0, ph), (0, pw)), mode="reflect")
        y = np.pad(y, ((0, ph), (0, pw)), constant_values=NODATA_LABEL)
        h, w = x.shape[-2:]
    top, left = rng.integers(0, h - tile + 1), rng.integers(0, w - tile + 1)
    x, y = x[..., top:top + tile, left:left + tile], y[top:top + tile, left:left + tile]
    k = int(rng.integers(4))
    x, y = np.rot90(x, k, axes=(-2, -1)), np.rot90(y, k)
    if rng.random() < 0.5:
        x, y = x[..., ::-1], y[:, ::-1]
    return np.ascontiguousarray(x), np.ascontiguousarray(y)


def batches(pool, rng: np.random.Generator, batch: int, tiles):
    """Endless (x [B,C,S,S] or [B,C,T,S,S], y [B,S,S]) batches; each batch draws one tile size S from `tiles`."""
    while True:
        tile = int(rng.choice(tiles))
        pairs = [crop(*pool[rng.integers(len(pool))], tile, rng) for _ in range(batch)]
        yield (torch.from_numpy(np.stack([p[0] for p in pairs])),
               torch.from_numpy(np.stack([p[1] for p in pairs]).astype(np.int64)))


def train(model, pool, args, rng: np.random.Generator) -> float:
    """Adam with linear warm-up and cosine decay; returns the mean loss of the last 50 steps."""
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    warmup = min(50, args.steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(warmup, 1)) * 0.5
                                              * (1 + np.cos(np.pi * min(s, args.steps) / args.steps)))
    model.train()
    losses, start = [], time.time()
    for step, (x, y) in zip(range(1, args.steps + 1), batches(pool, rng, args.batch, args.tiles)):
        loss = F.cross_entropy(model(x), y, ignore_index=NODATA_LABEL)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % args.log_every == 0 or step == args.steps:
            print(f"step {step:5d}  loss {np.mean(losses[-args.log_every:]):.4f}  "
                  f"lr {sched.get_last_lr()[0]:.2e}  {time.time() - start:6.0f} s", flush=True)
    return float(np.mean(losses[-50:]))


@torch.no_grad()
def predict(model, x: np.ndarray, pad_to: int = 0) -> np.ndarray:
    """Class map [H, W] of one scene: a whole-scene forward (the model pads to 2 x patch itself),
    or, with pad_to, reflect-padded bottom/right to pad_to first as the tile stage does."""
    h, w = x.shape[-2:]
    if pad_to:
        x = np.pad(x, (*((0, 0),) * (x.ndim - 2), (0, pad_to - h), (0, pad_to - w)), mode="reflect")
    logits = model(torch.from_numpy(np.ascontiguousarray(x))[None])
    return logits[0, :, :h, :w].argmax(0).numpy()


def confusion(pred: np.ndarray, labels: np.ndarray, classes: int = 2) -> np.ndarray:
    """classes x classes counts [true, predicted] over labelled pixels (255 ignored)."""
    keep = labels != NODATA_LABEL
    return np.bincount(labels[keep].astype(np.int64) * classes + pred[keep],
                       minlength=classes * classes).reshape(classes, classes)


def ious(counts: np.ndarray, class_names) -> dict:
    """Two classes: IoU of the target class (1), of the background (0), their mean, and the pixels counted.
    More: each class's IoU, their mean (classes present only), pixel accuracy and the pixels counted."""
    inter = np.diag(counts).astype(float)
    union = counts.sum(0) + counts.sum(1) - inter
    per_class = inter / np.maximum(union, 1)
    if len(class_names) == 2:
        background, target = per_class.tolist()
        return {f"{class_names[1]}_iou": round(target, 4), f"{class_names[0]}_iou": round(background, 4),
                "miou": round((background + target) / 2, 4), "pixels": int(counts.sum())}
    present = counts.sum(1) > 0
    return {"miou": round(float(per_class[present].mean()), 4),
            "accuracy": round(float(inter.sum() / max(counts.sum(), 1)), 4), "pixels": int(counts.sum()),
            "iou": {name: round(float(v), 4) for name, v, p in zip(class_names, per_class, present) if p}}


def evaluate(model, geo, target: str) -> dict:
    """IoU on held-out scenes (EVAL_SEEDS x EVAL_SIZES), pooled over pixels, per size and overall,
    for a whole-scene forward and for the pipeline's default tiling (one 512 tile, reflect-padded)."""
    model.eval()
    result, classes = {}, len(geo.class_names)
    for mode in ("whole_scene", "tile512"):
        total, per_size = np.zeros((classes, classes), np.int64), {}
        for h, w in EVAL_SIZES:
            counts = np.zeros((classes, classes), np.int64)
            for seed in EVAL_SEEDS:
                dn, labels = make_scene(h, w, seed=seed, target=target)
                pred = predict(model, model_input(dn, geo), PIPELINE_TILE if mode == "tile512" else 0)
                counts += confusion(pred, labels, classes)
            per_size[f"{h}x{w}"] = ious(counts, geo.class_names)
            total += counts
        result[mode] = {**ious(total, geo.class_names), "by_size": per_size}
    return result


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("overrides", nargs="*", help="config overrides, e.g. model.prithvi.embed_dim=96")
    p.add_argument("--target", choices=sorted(MODELS), default="water",
                   help="what the model marks: water (the flood demo), burn_scar or crops; picks the model config")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tiles", type=int, nargs="+", default=[64, 96, 128], help="tile sizes, one per batch")
    p.add_argument("--pool", type=int, default=160, help="training scenes generated up front")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--out", type=Path, help="output directory (default: the config's checkpoint directory)")
    p.add_argument("--eval-only", action="store_true", help="score the existing weights, write nothing")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = compose([f"model={MODELS[args.target]}", *args.overrides]).model
    if args.eval_only:
        print(json.dumps(evaluate(load_prithvi(cfg), cfg.geo, args.target), indent=2))
        return
    out = args.out or Path(cfg.checkpoint).parent
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    model = build_prithvi_segmentation(cfg.prithvi, in_chans=len(cfg.geo.bands))
    params = sum(p.numel() for p in model.parameters())
    print(f"{cfg.name}: {params:,} parameters; generating {args.pool} training scenes", flush=True)
    start = time.time()
    pool = make_pool(args.pool, rng, cfg.geo, args.target)
    final_loss = train(model, pool, args, rng)
    train_s = time.time() - start
    metrics = evaluate(model, cfg.geo, args.target)
    out.mkdir(parents=True, exist_ok=True)
    save_safetensors(model, str(out / "model.safetensors"))
    record = {
        "model": cfg.name, "parameters": params, "bytes": (out / "model.safetensors").stat().st_size,
        "command": " ".join(["python", "scripts/train_prithvi_flood.py", *(argv or sys.argv[1:])]),
        "train": {"steps": args.steps, "batch": args.batch, "tiles": args.tiles, "lr": args.lr,
                  "weight_decay": args.weight_decay, "seed": args.seed, "threads": args.threads,
                  "scenes": f"{args.pool} scenes, seeds {TRAIN_SEED0}..{TRAIN_SEED0 + args.pool - 1}, 96..512 px",
                  "final_loss": round(final_loss, 4), "seconds": round(train_s, 1), "torch": torch.__version__},
        "eval": {"seeds": list(EVAL_SEEDS), "sizes": [f"{h}x{w}" for h, w in EVAL_SIZES], **metrics},
    }
    (out / "metrics.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
