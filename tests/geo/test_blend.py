"""Blending weights and the strip stitcher, without files."""
import numpy as np
import pytest

from appliance.stages.geo.blend import StripStitcher, axis_profile
from appliance.stages.geo.blend import Blending
from appliance.stages.geo.plan import axis_overlaps, plan_tiles


@pytest.mark.parametrize("kind", [Blending.cosine, Blending.linear])
@pytest.mark.parametrize("length, tile, stride",
                         [(1000, 256, 192), (1000, 512, 448), (300, 128, 96), (97, 32, 9), (64, 64, 48)])
def test_ramps_sum_to_one_everywhere(kind, length, tile, stride):
    """Complementary ramps over each overlap: the raw weights already partition unity."""
    plan = plan_tiles(length, 1, tile, stride)
    total, cover = np.zeros(length), np.zeros(length)
    for start, (lead, trail) in zip(plan.ys, axis_overlaps(plan.ys, tile, length)):
        extent = min(tile, length)
        total[start:start + extent] += axis_profile(extent, lead, trail, kind)
        cover[start:start + extent] += 1
    assert (cover <= 2).any()
    # Where at most two tiles meet, the weights sum to one; elsewhere the blend divides by Σw.
    np.testing.assert_allclose(total[cover <= 2], 1.0, atol=1e-12)
    assert (total > 0).all()


@pytest.mark.parametrize(
    "extent, lead, trail, kind, expected",
    [
        (4, 0, 0, Blending.cosine, [1, 1, 1, 1]),  # scene borders are not tapered
        (4, 2, 0, Blending.linear, [0.25, 0.75, 1, 1]),
        (4, 0, 2, Blending.linear, [1, 1, 0.75, 0.25]),
        (4, 2, 2, Blending.none, [1, 1, 1, 1]),
        (2, 1, 0, Blending.cosine, [0.5, 1]),
    ],
)
def test_axis_profile(extent, lead, trail, kind, expected):
    np.testing.assert_allclose(axis_profile(extent, lead, trail, kind), expected)


def run_stitcher(plan, tile_logits, blending=Blending.cosine, order=None):
    """Feed tiles (in `order`) and assemble the strips into a full array, checking strip order."""
    stitcher = StripStitcher(plan, 1, blending)
    out = np.full((plan.height, plan.width), np.nan, dtype=np.float32)
    windows = list(plan.tiles())
    next_row, max_open = 0, 0
    for index in order or range(len(windows)):
        window = windows[index]
        logits = np.zeros((1, plan.tile_size, plan.tile_size), dtype=np.float32)  # padded tile
        logits[0, :window.height, :window.width] = tile_logits(window)
        valid = np.ones((window.height, window.width), dtype=bool)
        for strip in stitcher.add(window, logits, valid):
            assert strip.row_off == next_row
            rows = strip.logits.shape[1]
            out[strip.row_off:strip.row_off + rows] = strip.logits[0]
            next_row += rows
        max_open = max(max_open, len(stitcher.open))
    assert stitcher.finished and next_row == plan.height
    return out, max_open


def smooth(y, x):
    return np.sin(y / 37.0) + np.cos(x / 23.0) + 0.001 * x * y


def test_pointwise_logits_blend_exactly():
    """Every tile agrees on a pixel: the blend must return that value (weights normalised, windows right)."""
    plan = plan_tiles(300, 410, 64, 40)
    out, _ = run_stitcher(plan, lambda w: smooth(*np.mgrid[w.y:w.y + w.height, w.x:w.x + w.width]))
    np.testing.assert_allclose(out, smooth(*np.mgrid[0:300, 0:410]), atol=1e-4)


def test_out_of_order_tiles_within_rows():
    plan = plan_tiles(200, 200, 64, 48)
    per_row = len(plan.xs)
    order = [r * per_row + c for r in range(len(plan.ys)) for c in reversed(range(per_row))]
    out, _ = run_stitcher(plan, lambda w: smooth(*np.mgrid[w.y:w.y + w.height, w.x:w.x + w.width]), order=order)
    np.testing.assert_allclose(out, smooth(*np.mgrid[0:200, 0:200]), atol=1e-4)


def test_open_strips_stay_bounded():
    """Only strips of the tile row in flight (plus what it overlaps) are held, whatever the height."""
    for height in (256, 4096):
        plan = plan_tiles(height, 128, 64, 48)
        _, max_open = run_stitcher(plan, lambda w: np.zeros((w.height, w.width)))
        assert max_open <= 2  # ceil(64 / 48)


def max_jump(image):
    return max(np.abs(np.diff(image, axis=0)).max(), np.abs(np.diff(image, axis=1)).max())


def test_no_seams_with_tile_dependent_logits():
    """A model whose answer shifts per tile (context): cosine blending ramps the shift across the
    overlap instead of jumping; uniform averaging jumps at overlap borders."""
    plan = plan_tiles(320, 320, 64, 48)
    rng = np.random.default_rng(0)
    bias = rng.uniform(-1, 1, plan.count)

    def tile_logits(w):
        return smooth(*np.mgrid[w.y:w.y + w.height, w.x:w.x + w.width]) + bias[w.index]

    base = smooth(*np.mgrid[0:320, 0:320])
    cosine, _ = run_stitcher(plan, tile_logits, Blending.cosine)
    uniform, _ = run_stitcher(plan, tile_logits, Blending.none)
    overlap = 64 - 48
    bound = 2.0 * np.pi / (2 * overlap)  # max |Δbias| x max slope of the cosine ramp
    assert max_jump(cosine - base) <= bound * 1.05
    assert max_jump(uniform - base) > 3 * bound


def test_duplicate_tile_and_bad_shape_are_errors():
    plan = plan_tiles(10, 10, 8, 8)
    stitcher = StripStitcher(plan, 2, Blending.cosine)
    window = next(plan.tiles())
    with pytest.raises(RuntimeError, match="logits of shape"):
        stitcher.add(window, np.zeros((3, 8, 8), np.float32), np.ones((8, 8), bool))
    stitcher.add(window, np.zeros((2, 8, 8), np.float32), np.ones((8, 8), bool))
    with pytest.raises(RuntimeError, match="arrived twice"):
        stitcher.add(window, np.zeros((2, 8, 8), np.float32), np.ones((8, 8), bool))
