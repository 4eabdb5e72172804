"""The synthetic shapes generator is deterministic and its labels describe the image."""
import json

import numpy as np
import pytest

from scripts.synthetic_shapes import COLORS, SHAPES, generate, main, make_sample, qa_pairs


def test_same_seed_same_pixels_and_labels():
    a = [(np.asarray(im), lab) for im, lab in generate(5, seed=3)]
    b = [(np.asarray(im), lab) for im, lab in generate(5, seed=3)]
    assert all(np.array_equal(x[0], y[0]) and x[1] == y[1] for x, y in zip(a, b))
    assert not np.array_equal(np.asarray(make_sample(1)[0]), np.asarray(make_sample(2)[0]))


def test_labels_match_the_pixels():
    seen = set()
    for image, labels in generate(60, seed=0):
        seen.add((labels.shape, labels.color))
        assert image.mode == "RGB" and image.size == labels.image_size
        assert 64 <= image.width <= 512 and 64 <= image.height <= 512
        pixels = np.asarray(image).reshape(-1, 3)
        shape_pixels = (pixels == COLORS[labels.color]).all(axis=1).sum()
        assert shape_pixels > 0.1 * (labels.bbox[2] - labels.bbox[0]) ** 2  # the shape is drawn, big enough
        corner = np.asarray(image)[0, 0]
        background = corner[0] == corner[1] == corner[2]
        assert background and (corner[0] >= 200 if labels.background == "light" else corner[0] <= 55)
        left, top, right, bottom = labels.bbox
        assert 0 <= left < right <= image.width and 0 <= top < bottom <= image.height
    assert len(seen) > 15  # most of the 24 combinations turn up


@pytest.mark.parametrize("shape", SHAPES)
def test_forced_choices_and_qa(shape):
    _, labels = make_sample(0, shape=shape, color="purple")
    assert (labels.shape, labels.color) == (shape, "purple")
    assert qa_pairs(labels) == [("What color is the shape?", "The shape is purple."),
                                ("What shape is this?", f"It is a {shape}.")]
    for question, answer in qa_pairs(labels, rng=5):
        assert question.endswith("?") and ("purple" in answer or shape in answer)


def test_cli_writes_pngs_and_labels(tmp_path):
    main(["--count", "3", "--seed", "1", "--out", str(tmp_path)])
    rows = [json.loads(line) for line in (tmp_path / "labels.jsonl").read_text().splitlines()]
    assert [r["file"] for r in rows] == ["00000.png", "00001.png", "00002.png"]
    assert all((tmp_path / r["file"]).exists() and r["shape"] in SHAPES for r in rows)
