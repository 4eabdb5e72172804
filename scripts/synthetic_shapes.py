"""Deterministic synthetic images for training and testing a tiny LLaVA: one coloured shape on a plain
background, with its labels and question/answer pairs.

    from scripts.synthetic_shapes import make_sample, generate, qa_pairs
    image, labels = make_sample(seed=7)               # same seed → same pixels and labels
    for image, labels in generate(100, seed=0): ...
    qa_pairs(labels)  # [("What color is the shape?", "The shape is red."), ("What shape is this?", "It is a circle.")]

    python scripts/synthetic_shapes.py --count 20 --seed 0 --out /tmp/shapes   # PNGs + labels.jsonl

Each sample: background of random size (64-512 per side) in a random light (200-255) or dark (0-55)
neutral grey; one shape (circle, square, triangle, star) in one of six saturated colours, of random size
(25-70 % of the short side) at a random position fully inside the image.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
from dataclasses import asdict, dataclass
from typing import Iterator, Optional, Union

from PIL import Image, ImageDraw

SHAPES = ("circle", "square", "triangle", "star")
COLORS = {
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (30, 70, 220),
    "yellow": (240, 210, 20),
    "purple": (140, 40, 180),
    "orange": (245, 130, 20),
}
COLOR_QUESTIONS = ("What color is the shape?", "What colour is the shape in the image?",
                   "Which color is the object?")
COLOR_ANSWERS = ("The shape is {color}.", "It is {color}.")
SHAPE_QUESTIONS = ("What shape is this?", "What shape is in the image?", "Which shape do you see?")
SHAPE_ANSWERS = ("It is a {shape}.", "This is a {shape}.")


@dataclass(frozen=True)
class ShapeLabels:
    shape: str
    color: str
    background: str               # "light" or "dark"
    image_size: tuple[int, int]   # (width, height)
    bbox: tuple[int, int, int, int]  # (left, top, right, bottom) of the shape's square


def _rng(seed: Union[int, random.Random, None]) -> random.Random:
    return seed if isinstance(seed, random.Random) else random.Random(seed)


def make_sample(seed: Union[int, random.Random, None] = 0, *, shape: Optional[str] = None,
                color: Optional[str] = None, min_side: int = 64,
                max_side: int = 512) -> tuple[Image.Image, ShapeLabels]:
    """One image and its labels; `shape`/`color` force a choice (for balanced sets)."""
    rng = _rng(seed)
    shape = shape or rng.choice(SHAPES)
    color = color or rng.choice(sorted(COLORS))
    if shape not in SHAPES or color not in COLORS:
        raise ValueError(f"shape must be one of {SHAPES} and color one of {sorted(COLORS)}")
    width, height = rng.randint(min_side, max_side), rng.randint(min_side, max_side)
    light = rng.random() < 0.5
    grey = rng.randint(200, 255) if light else rng.randint(0, 55)
    image = Image.new("RGB", (width, height), (grey, grey, grey))
    size = max(8, int(min(width, height) * rng.uniform(0.25, 0.7)))
    left, top = rng.randint(0, width - size), rng.randint(0, height - size)
    _draw(ImageDraw.Draw(image), shape, (left, top, left + size - 1, top + size - 1),
          COLORS[color], rng.uniform(0, 2 * math.pi))
    return image, ShapeLabels(shape, color, "light" if light else "dark", (width, height),
                              (left, top, left + size, top + size))


def _draw(draw: ImageDraw.ImageDraw, shape: str, box, fill, angle: float) -> None:
    left, top, right, bottom = box
    cx, cy, r = (left + right) / 2, (top + bottom) / 2, (right - left) / 2
    if shape == "circle":
        draw.ellipse(box, fill=fill)
    elif shape == "square":
        draw.rectangle((cx - r * 0.8, cy - r * 0.8, cx + r * 0.8, cy + r * 0.8), fill=fill)
    elif shape == "triangle":  # upright, inscribed in the circle of radius r
        draw.polygon([(cx + r * math.cos(a), cy + r * math.sin(a))
                      for a in (-math.pi / 2, math.pi / 6, 5 * math.pi / 6)], fill=fill)
    else:  # five-pointed star, turned by a random angle
        points = []
        for i in range(10):
            radius = r if i % 2 == 0 else r * 0.42
            a = angle + i * math.pi / 5
            points.append((cx + radius * math.cos(a), cy + radius * math.sin(a)))
        draw.polygon(points, fill=fill)


def generate(count: int, seed: int = 0, **kwargs) -> Iterator[tuple[Image.Image, ShapeLabels]]:
    """`count` samples from one seeded stream: the same (count, seed) always gives the same images."""
    rng = random.Random(seed)
    for _ in range(count):
        yield make_sample(rng, **kwargs)


def qa_pairs(labels: ShapeLabels, rng: Union[int, random.Random, None] = None) -> list[tuple[str, str]]:
    """(question, answer) about colour and shape; with `rng`, phrasings are drawn, else the first ones."""
    pick = (lambda options: options[0]) if rng is None else _rng(rng).choice
    return [
        (pick(COLOR_QUESTIONS), pick(COLOR_ANSWERS).format(color=labels.color)),
        (pick(SHAPE_QUESTIONS), pick(SHAPE_ANSWERS).format(shape=labels.shape)),
    ]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="directory for NNNNN.png and labels.jsonl")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    qa_rng = random.Random(args.seed + 1)
    with open(os.path.join(args.out, "labels.jsonl"), "w") as f:
        for i, (image, labels) in enumerate(generate(args.count, args.seed)):
            name = f"{i:05d}.png"
            image.save(os.path.join(args.out, name))
            f.write(json.dumps({"file": name, **asdict(labels), "qa": qa_pairs(labels, qa_rng)}) + "\n")
    print(f"wrote {args.count} images to {args.out}")


if __name__ == "__main__":
    main()
