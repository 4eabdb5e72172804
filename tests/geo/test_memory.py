"""Peak memory of the chain must not grow with the scene: strips are flushed as they finish."""
import gc
import tracemalloc

import numpy as np

from tests.geo.conftest import run_geo, synthetic

WIDTH, TILE, OVERLAP = 256, 64, 16


def peak_bytes(path, out):
    gc.collect()
    tracemalloc.start()  # numpy reports its buffers to tracemalloc: arrays read, tiles, strips
    try:
        run_geo(str(path), out, tile_size=TILE, overlap=OVERLAP, fake={"as_numpy": True})
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_peak_memory_does_not_grow_with_scene_height(tmp_path):
    small, large = tmp_path / "small.tif", tmp_path / "large.tif"
    synthetic.write_scene(small, 512, WIDTH, seed=1)
    synthetic.write_scene(large, 2048, WIDTH, seed=1)  # 4x the area
    peak_bytes(small, tmp_path / "warmup.tif")  # first-use allocations (imports, caches) out of the way
    small_peak = peak_bytes(small, tmp_path / "small.mask.tif")
    large_peak = peak_bytes(large, tmp_path / "large.mask.tif")
    whole_scene_logits = 2 * 2048 * WIDTH * np.dtype(np.float32).itemsize  # what a naive stitcher holds
    assert large_peak <= 1.5 * small_peak, (small_peak, large_peak)
    assert large_peak < whole_scene_logits / 2, (large_peak, whole_scene_logits)
