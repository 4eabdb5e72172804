"""Tile planning: table-driven, pure."""
import itertools

import pytest

from appliance.errors import ConfigError
from appliance.stages.geo.tile import TileOptions, effective_stride
from appliance.stages.geo.plan import axis_overlaps, axis_starts, check_axis_covered, plan_tiles


@pytest.mark.parametrize(
    "length, tile, stride, starts",
    [
        (512, 512, 448, [0]),  # exact fit: one tile
        (100, 512, 448, [0]),  # smaller than a tile: one tile, padded by the reader
        (1, 512, 448, [0]),  # one pixel
        (513, 512, 448, [0, 1]),  # one pixel over: the second tile is snapped to the border
        (1000, 512, 448, [0, 448, 488]),  # last tile snapped (overlap 472 with the previous)
        (1024, 256, 256, [0, 256, 512, 768]),  # no overlap, exact multiple
        (1000, 256, 256, [0, 256, 512, 744]),  # no overlap, snapped last tile overlaps
        (10, 4, 1, [0, 1, 2, 3, 4, 5, 6]),  # stride 1
        (9, 4, 3, [0, 3, 5]),
        (224, 224, 192, [0]),  # terratorch's defaults, image fits one crop
        (500, 224, 192, [0, 192, 276]),
    ],
)
def test_axis_starts(length, tile, stride, starts):
    assert axis_starts(length, tile, stride) == starts
    check_axis_covered(starts, tile, length)


def test_formula_and_coverage_hold_for_many_sizes():
    for length, tile, stride in itertools.product(range(1, 70, 3), range(1, 40, 4), range(1, 40, 5)):
        if stride > tile:
            continue
        starts = axis_starts(length, tile, stride)
        expected = 1 if length <= tile else -(-(length - tile) // stride) + 1
        assert len(starts) == expected
        assert starts[0] == 0 and starts == sorted(set(starts))
        assert starts[-1] == max(0, length - tile)  # snapped to the border
        assert all(b - a <= stride for a, b in zip(starts, starts[1:]))
        check_axis_covered(starts, tile, length)


@pytest.mark.parametrize(
    "starts, tile, length, message",
    [
        ([0, 5], 4, 9, "pixels 4..4 uncovered"),  # a gap between tiles
        ([0], 4, 6, "pixels 4..5 uncovered"),  # tiles stop before the border
        ([1], 4, 4, "pixels 0..0 uncovered"),  # first tile does not start at 0
    ],
)
def test_uncovered_pixels_are_a_loud_error(starts, tile, length, message):
    with pytest.raises(RuntimeError, match=message):
        check_axis_covered(starts, tile, length, "row")


@pytest.mark.parametrize("length, tile, stride", [(10, 4, 0), (10, 4, 5), (0, 4, 2), (10, 0, 1)])
def test_bad_tiling_arguments(length, tile, stride):
    with pytest.raises(ValueError):
        axis_starts(length, tile, stride)


@pytest.mark.parametrize(
    "starts, tile, length, overlaps",
    [
        ([0], 512, 100, [(0, 0)]),
        ([0, 448, 488], 512, 1000, [(0, 64), (64, 472), (472, 0)]),
        ([0, 256, 512, 744], 256, 1000, [(0, 0), (0, 0), (0, 24), (24, 0)]),
    ],
)
def test_axis_overlaps(starts, tile, length, overlaps):
    assert axis_overlaps(starts, tile, length) == overlaps


@pytest.mark.parametrize(
    "height, width, tile, stride, ys, xs, extent",
    [
        (300, 400, 128, 96, [0, 96, 172], [0, 96, 192, 272], (128, 128)),
        (1, 1, 512, 448, [0], [0], (1, 1)),  # 1 pixel: one padded tile
        (100, 1000, 512, 448, [0], [0, 448, 488], (100, 512)),  # a thin strip
    ],
)
def test_plan_tiles(height, width, tile, stride, ys, xs, extent):
    plan = plan_tiles(height, width, tile, stride)
    assert (plan.ys, plan.xs, plan.count) == (ys, xs, len(ys) * len(xs))
    windows = list(plan.tiles())
    assert [w.index for w in windows] == list(range(plan.count))
    assert {(w.height, w.width) for w in windows} == {extent}
    assert [(w.y, w.x) for w in windows] == [(y, x) for y in ys for x in xs]  # row-major
    # strips partition the rows
    rows = [plan.strip_rows(k) for k in range(len(ys))]
    assert rows[0][0] == 0 and rows[-1][1] == height
    assert all(a[1] == b[0] for a, b in zip(rows, rows[1:]))


@pytest.mark.parametrize(
    "tile_size, stride, overlap, expected",
    [
        (512, None, None, 448),  # default overlap tile_size // 8
        (512, 384, None, 384),
        (512, None, 0, 512),
        (512, 448, 64, 448),  # both given and consistent
        (1, None, None, 1),
        (512, 448, 32, "disagree"),
        (512, 0, None, "stride: must be in 1..tile_size"),
        (512, 513, None, "stride: must be in 1..tile_size"),
        (512, None, 512, "overlap: must be in 0..tile_size-1"),
        (512, None, -1, "overlap: must be in 0..tile_size-1"),
        (0, None, None, "tile_size: must be >= 1"),
    ],
)
def test_effective_stride(tile_size, stride, overlap, expected):
    options = TileOptions(tile_size=tile_size, stride=stride, overlap=overlap)
    if isinstance(expected, int):
        assert effective_stride(options, tile_size) == expected
    else:
        with pytest.raises(ConfigError, match=expected):
            effective_stride(options, tile_size)
