"""Parity with terratorch through the pipeline's own coordinates: scenes dated and centred as the golden
fixture's two samples get, from `raster_read`, exactly the fixture's coordinates, and the pool engine
(both tiles batched in one forward, as the engine stage runs them) gives terratorch's logits with them."""
import datetime as dt

import pytest
import rasterio
import torch
from affine import Affine
from omegaconf import OmegaConf

from appliance.config.schema import EngineConfig
from appliance.engine.pool_engine import PoolEngine
from appliance.stages.geo.raster_read import RasterRead, RasterReadOptions
from tests.geo.conftest import synthetic
from tests.prithvi.helpers import GOLDEN, golden_prithvi_cfg, golden_reference, model_cfg
from tests.prithvi.test_parity import TOL, _golden_model

SCENE = (64, 96)  # rows, columns


def _scene_at(path, lat, lon, crs, tags=None):
    """A synthetic scene whose centre is (lat, lon): on a lon/lat grid, or on the UTM zone's."""
    synthetic.write_scene(path, *SCENE, seed=2)
    if crs == "EPSG:4326":
        res = 0.001
        transform = Affine(res, 0, lon - SCENE[1] / 2 * res, 0, -res, lat + SCENE[0] / 2 * res)
    else:
        from rasterio.warp import transform as warp

        xs, ys = warp("EPSG:4326", crs, [lon], [lat])
        transform = Affine(30, 0, xs[0] - SCENE[1] / 2 * 30, 0, -30, ys[0] + SCENE[0] / 2 * 30)
    with rasterio.open(path, "r+") as ds:
        ds.crs, ds.transform = rasterio.crs.CRS.from_string(crs), transform
        if tags:
            ds.update_tags(**tags)
    return path


def _reader():
    cfg = OmegaConf.create({"model": model_cfg(golden_prithvi_cfg(), GOLDEN / "checkpoint.pt")})
    cfg.model.geo.bands = list(synthetic.BANDS)
    cfg.model.geo.scale = 0.0001
    return RasterRead(RasterReadOptions(), cfg)


def _pipeline_coords(tmp_path):
    """The coordinates raster_read gives the fixture's two samples: 2018 day 196 at (-15.3, 27.9), from the
    file's TIFFTAG_DATETIME on a UTM grid; 2021 day 32 at (44.8, -93.2), given as date= on a lon/lat grid."""
    first = _scene_at(tmp_path / "a.tif", -15.3, 27.9, "EPSG:32735", {"TIFFTAG_DATETIME": "2018:07:15 09:30:00"})
    second = _scene_at(tmp_path / "b.tif", 44.8, -93.2, "EPSG:4326")
    records = [{"input_path": str(first)}, {"input_path": str(second), "date": "2021-02-01"}]
    return [record["scene"].coords for record in _reader().process(iter(records))]


def test_the_pipeline_builds_the_fixtures_coordinates(tmp_path):
    ref = golden_reference()
    coords = _pipeline_coords(tmp_path)
    assert torch.equal(torch.stack([c.temporal for c in coords]), ref["temporal_coords"])  # [B, T=1, 2]
    assert torch.allclose(torch.stack([c.location for c in coords]), ref["location_coords"], atol=1e-5, rtol=0)
    assert dt.date(2018, 1, 1) + dt.timedelta(days=195) == dt.date(2018, 7, 15)  # day 196 is 1-based


def test_engine_with_pipeline_coords_matches_terratorch(tmp_path):
    ref = golden_reference()
    coords = _pipeline_coords(tmp_path)
    engine = PoolEngine(_golden_model(), EngineConfig(kind="pool", max_batch_size=2))
    ids = [engine.add_request([ref["input"][i]], coords=coords[i]) for i in range(2)]
    done = {}
    while engine.has_unfinished():
        done.update({out.request_id: out.output[0] for out in engine.step()})
    assert engine.num_forwards == 1  # both scenes' tiles in one batch, each with its own coordinates
    logits = torch.stack([done[i] for i in ids])
    assert (logits - ref["logits"]).abs().max().item() < TOL
    assert (logits - ref["logits_no_coords"]).abs().max().item() > 100 * TOL


def test_items_without_coordinates_run_apart_and_as_without_coords():
    ref = golden_reference()
    engine = PoolEngine(_golden_model(), EngineConfig(kind="pool", max_batch_size=2))
    from appliance.engine.geo_coords import GeoCoords

    with_coords = GeoCoords(ref["temporal_coords"][0], ref["location_coords"][0])
    first = engine.add_request([ref["input"][0]], coords=with_coords)
    second = engine.add_request([ref["input"][1]])  # a scene with neither date nor CRS
    done = {}
    while engine.has_unfinished():
        done.update({out.request_id: out.output[0] for out in engine.step()})
    assert engine.num_forwards == 2  # a batch never mixes items with and without coordinates
    assert (done[first] - ref["logits"][0]).abs().max().item() < TOL
    assert (done[second] - ref["logits_no_coords"][1]).abs().max().item() < TOL


@pytest.mark.parametrize("crs", ["EPSG:4326", "EPSG:32735"])
def test_centres_on_either_grid_are_the_fixtures(tmp_path, crs):
    path = _scene_at(tmp_path / "s.tif", -15.3, 27.9, crs)
    record = next(_reader().process(iter([{"input_path": str(path), "date": "2018-07-15"}])))
    assert record["scene"].centre == pytest.approx((-15.3, 27.9), abs=1e-6)
