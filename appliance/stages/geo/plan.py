"""Tile planning: pure functions, no I/O.

Along one axis of length L, with tile size T and stride S (1 <= S <= T):

    L <= T:  one tile at 0, of extent L (the reader pads it up to T)
    L >  T:  n = ceil((L - T) / S) + 1 tiles, start_i = min(i * S, L - T)

so tiles step by S and the last one is snapped to the border (its overlap with the previous
tile may be larger than T - S). A scene's tiles are the product of the row and column starts,
in row-major order. `check_axis_covered` raises if any pixel would be left without a tile.
"""
from dataclasses import dataclass
from functools import cached_property
from typing import List, Tuple


def axis_starts(length: int, tile: int, stride: int) -> List[int]:
    if length < 1 or tile < 1 or not 1 <= stride <= tile:
        raise ValueError(f"bad tiling: length={length}, tile={tile}, stride={stride} (need 1 <= stride <= tile)")
    if length <= tile:
        return [0]
    count = -(-(length - tile) // stride) + 1
    return [min(i * stride, length - tile) for i in range(count)]


def check_axis_covered(starts: List[int], tile: int, length: int, axis: str = "axis") -> None:
    """Raise RuntimeError naming the first pixel range that no tile covers."""
    covered = 0
    for start in starts:
        if start > covered:
            raise RuntimeError(f"tile plan leaves {axis} pixels {covered}..{start - 1} uncovered")
        covered = max(covered, start + tile)
    if covered < length:
        raise RuntimeError(f"tile plan leaves {axis} pixels {covered}..{length - 1} uncovered")


def axis_overlaps(starts: List[int], tile: int, length: int) -> List[Tuple[int, int]]:
    """(overlap with the previous tile, overlap with the next tile) per start, within the scene."""
    extent = min(tile, length)
    result = []
    for i, start in enumerate(starts):
        lead = starts[i - 1] + extent - start if i > 0 else 0
        trail = start + extent - starts[i + 1] if i + 1 < len(starts) else 0
        result.append((max(lead, 0), max(trail, 0)))
    return result


@dataclass(frozen=True)
class TileWindow:
    index: int  # row-major position in the plan
    row: int  # tile row (index into plan.ys)
    col: int
    y: int
    x: int
    height: int  # extent inside the scene: tile_size, or the scene size when it is smaller
    width: int


@dataclass(frozen=True)
class TilePlan:
    height: int
    width: int
    tile_size: int
    stride: int

    @cached_property
    def ys(self) -> List[int]:
        return axis_starts(self.height, self.tile_size, self.stride)

    @cached_property
    def xs(self) -> List[int]:
        return axis_starts(self.width, self.tile_size, self.stride)

    @property
    def count(self) -> int:
        return len(self.ys) * len(self.xs)

    def tiles(self):
        th, tw = min(self.tile_size, self.height), min(self.tile_size, self.width)
        for r, y in enumerate(self.ys):
            for c, x in enumerate(self.xs):
                yield TileWindow(r * len(self.xs) + c, r, c, y, x, th, tw)

    def strip_rows(self, row: int) -> Tuple[int, int]:
        """Scene rows [start, stop) of output strip `row`: from tile row `row`'s start to the next's.

        Strip k is final once tile rows 0..k have all arrived: later tile rows start below it.
        """
        stop = self.ys[row + 1] if row + 1 < len(self.ys) else self.height
        return self.ys[row], stop


def plan_tiles(height: int, width: int, tile_size: int, stride: int) -> TilePlan:
    if height < 1 or width < 1:
        raise ValueError(f"cannot tile an empty scene ({width}x{height})")
    plan = TilePlan(height, width, tile_size, stride)
    check_axis_covered(plan.ys, tile_size, height, "row")
    check_axis_covered(plan.xs, tile_size, width, "column")
    return plan
