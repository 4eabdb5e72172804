"""Blend overlapping tile logits into finished row strips, holding only the strips still open.

Weights: each tile's window is the outer product of two 1-D profiles. Along an axis a profile is
1 except over the pixels shared with a neighbouring tile, where it ramps from ~0 at the tile's
edge to ~1; the ramp spans exactly that overlap, so (for cosine and linear) the two neighbours'
weights sum to 1 there. Scene borders are not tapered. The blend is Σ logits·w / Σ w per pixel.

Memory: output strip k holds scene rows [ys[k], ys[k+1]) and is final once tile rows 0..k have
all arrived (later tile rows start below it). Open strips are at most about tile_size + stride
rows of width W, whatever the scene height.
"""
from dataclasses import dataclass
from enum import Enum
from typing import Dict, List

import numpy as np

from appliance.stages.geo.plan import TilePlan, TileWindow, axis_overlaps


class Blending(str, Enum):
    """Weight window for overlapping tile logits; ramps span exactly each overlap with a neighbour."""

    cosine = "cosine"  # 0.5 - 0.5*cos(pi*t): smooth, complementary ramps sum to 1
    linear = "linear"  # t: continuous, kinks at the ramp ends
    none = "none"  # uniform weights: plain average of overlapping tiles (shows seams)


def ramp(t: np.ndarray, kind: Blending) -> np.ndarray:
    if kind is Blending.cosine:
        return 0.5 - 0.5 * np.cos(np.pi * t)
    if kind is Blending.linear:
        return t
    return np.ones_like(t)


def axis_profile(extent: int, lead: int, trail: int, kind: Blending) -> np.ndarray:
    """1-D weights of a tile of `extent` pixels sharing `lead`/`trail` pixels with its neighbours."""
    weights = np.ones(extent, dtype=np.float64)
    if lead:
        weights[:lead] *= ramp((np.arange(lead) + 0.5) / lead, kind)
    if trail:
        weights[extent - trail:] *= ramp((np.arange(trail)[::-1] + 0.5) / trail, kind)
    return weights


@dataclass
class Strip:
    """A finished band of output rows."""

    row_off: int
    logits: np.ndarray  # float32 [C, rows, W], blended
    valid: np.ndarray  # bool [rows, W]
    index: int  # strip number (== tile row)
    last: bool


class StripStitcher:
    """Accumulates one scene's tiles; `add` returns the strips it completed, in row order."""

    def __init__(self, plan: TilePlan, num_classes: int, blending: Blending):
        self.plan, self.num_classes = plan, num_classes
        rows = min(plan.tile_size, plan.height)
        cols = min(plan.tile_size, plan.width)
        row_overlaps = axis_overlaps(plan.ys, plan.tile_size, plan.height)
        col_overlaps = axis_overlaps(plan.xs, plan.tile_size, plan.width)
        self.row_profiles = [axis_profile(rows, a, b, blending) for a, b in row_overlaps]
        self.col_profiles = [axis_profile(cols, a, b, blending) for a, b in col_overlaps]
        self.pending = [len(plan.xs)] * len(plan.ys)  # tiles still expected per tile row
        self.arrived: Dict[int, set] = {}  # tile row -> columns seen, for rows still incomplete
        self.open: Dict[int, tuple] = {}  # strip index -> (sum of logits*w, sum of w, valid)
        self.next_strip = 0

    def _strip(self, k: int):
        if k not in self.open:
            start, stop = self.plan.strip_rows(k)
            shape = (stop - start, self.plan.width)
            self.open[k] = (
                np.zeros((self.num_classes, *shape), dtype=np.float32),
                np.zeros(shape, dtype=np.float32),
                np.zeros(shape, dtype=bool),
            )
        return self.open[k]

    def add(self, window: TileWindow, logits: np.ndarray, valid: np.ndarray) -> List[Strip]:
        h, w = window.height, window.width
        if logits.shape[0] != self.num_classes or logits.shape[1] < h or logits.shape[2] < w:
            raise RuntimeError(f"tile {window.index}: logits of shape {logits.shape} for a {h}x{w} window")
        seen = self.arrived.setdefault(window.row, set())
        if self.pending[window.row] <= 0 or window.col in seen:
            raise RuntimeError(f"tile {window.index} arrived twice")
        weights = np.outer(self.row_profiles[window.row], self.col_profiles[window.col]).astype(np.float32)
        logits = logits[:, :h, :w]
        for k in range(window.row, len(self.plan.ys)):
            start, stop = self.plan.strip_rows(k)
            if start >= window.y + h:
                break
            lo, hi = max(start, window.y), min(stop, window.y + h)
            acc, wsum, ok = self._strip(k)
            t0, t1, s0, s1 = lo - window.y, hi - window.y, lo - start, hi - start
            cols = slice(window.x, window.x + w)
            acc[:, s0:s1, cols] += logits[:, t0:t1] * weights[t0:t1]
            wsum[s0:s1, cols] += weights[t0:t1]
            ok[s0:s1, cols] |= valid[t0:t1]
        self.pending[window.row] -= 1
        seen.add(window.col)
        if not self.pending[window.row]:
            del self.arrived[window.row]
        return self._flush()

    def _flush(self) -> List[Strip]:
        done = []
        while self.next_strip < len(self.plan.ys) and all(p == 0 for p in self.pending[: self.next_strip + 1]):
            k = self.next_strip
            acc, wsum, ok = self.open.pop(k)
            if not (wsum > 0).all():
                bad = np.argwhere(wsum <= 0)[0]
                raise RuntimeError(f"pixel row {self.plan.strip_rows(k)[0] + bad[0]}, column {bad[1]} got no tile")
            acc /= wsum
            done.append(Strip(self.plan.strip_rows(k)[0], acc, ok, k, k == len(self.plan.ys) - 1))
            self.next_strip += 1
        return done

    @property
    def finished(self) -> bool:
        return self.next_strip == len(self.plan.ys)
