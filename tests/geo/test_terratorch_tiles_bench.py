"""benchmarks/terratorch_tiles.py's own parts (terratorch itself is not installed here): the settings our side
runs with, and the mask agreement that tells whether both sides computed the same map."""
import argparse
import importlib.util
from pathlib import Path

import numpy as np
import rasterio
from affine import Affine

from appliance.config.compose import compose
from appliance.stages.geo.plan import TilePlan
from tests.conftest import REPO


def bench():
    spec = importlib.util.spec_from_file_location("terratorch_tiles", REPO / "benchmarks" / "terratorch_tiles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_mask(path: Path, mask: np.ndarray) -> Path:
    with rasterio.open(path, "w", driver="GTiff", width=mask.shape[1], height=mask.shape[0], count=1,
                       dtype="uint8", nodata=255, crs="EPSG:32615", transform=Affine(30, 0, 0, 0, -30, 0)) as dst:
        dst.write(mask[None])
    return path


def test_our_side_runs_the_tile_overlap_batch_and_dtype_that_terratorch_gets(tmp_path):
    module = bench()
    args = argparse.Namespace(model="prithvi_300m_tl_flood", tile=None, overlap=None, batch=4, threads=2,
                              terratorch_bf16="autocast", dir=tmp_path)
    spec = module.base_spec(args)
    assert (spec["tile"], spec["overlap"]) == (512, 64)  # model.geo.tile_size and the tile stage's default
    assert spec["prithvi"]["embed_dim"] == 1024 and spec["temporal"] == [2023, 182]
    cfg = compose(module.our_overrides({**spec, "dtype": "bfloat16"}))
    tile = cfg.pipeline.stages.tile
    assert (tile.tile_size, tile.overlap, cfg.engine.max_batch_size, cfg.engine.dtype) == (512, 64, 4, "bfloat16")
    assert cfg.model.checkpoint == str(tmp_path / "prithvi_300m_tl_flood.pt")


def test_agreement_keeps_single_tile_pixels_apart_from_overlaps(tmp_path):
    plan = TilePlan(8, 12, 8, 4)  # columns 0-3 and 8-11 in one tile, 4-7 in two
    ours = np.zeros((8, 12), np.uint8)
    ours[0, 0] = 255  # nodata in ours only: left out of both shares
    theirs = np.zeros((8, 12), np.uint8)
    theirs[:4, 5] = 1  # 4 of the 32 overlap pixels
    theirs[0, 10] = 1  # 1 of the 63 single-tile pixels with a class in both
    text = bench().agreement(write_mask(tmp_path / "a.tif", ours), write_mask(tmp_path / "b.tif", theirs), plan)
    assert text.startswith(f"{62 / 63:.2%} one tile, {28 / 32:.2%} overlaps (nodata {95 / 96:.2%}, water 0%)")


def test_agreement_says_when_no_pixel_lies_in_an_overlap(tmp_path):
    mask = write_mask(tmp_path / "a.tif", np.ones((8, 8), np.uint8))
    assert bench().agreement(mask, mask, TilePlan(8, 8, 8, 7)).startswith("100.00% one tile, no pixels in overlaps")
