"""`appliance serve` with a TL model (`model=prithvi_tiny_tl_flood`, seeded random weights): `/v1/pool?date=`
reaches the model end to end. The dated mask's tags say the date and the sample's centre were given to the
model, and its pixels differ from the undated request's, which runs without the time encoding (as
tests/geo/test_tl_cli.py checks for `appliance run`)."""
import io

import httpx
import numpy as np
import pytest
import rasterio

from tests.geo.tiny_tl import tiny_tl_checkpoint
from tests.server_process import server_process
from tests.servers import SAMPLE_SCENE


@pytest.fixture(scope="module")
def tl_server(tmp_path_factory):
    checkpoint = tiny_tl_checkpoint(tmp_path_factory.mktemp("tiny_tl"))
    with server_process("pipeline=prithvi_flood", "model=prithvi_tiny_tl_flood", f"model.checkpoint={checkpoint}",
                        cwd=tmp_path_factory.mktemp("tl_serve"), env={"OMP_NUM_THREADS": "1"}) as server:
        yield server


def pool(server, **query):
    response = httpx.post(f"{server.base}/v1/pool", params=query, content=SAMPLE_SCENE.read_bytes(),
                          headers={"Content-Type": "image/tiff"}, timeout=120)
    assert response.status_code == 200, response.text
    with rasterio.open(io.BytesIO(response.content)) as ds:
        return ds.read(), ds.tags()


def test_a_tl_model_is_served_with_the_date_given_and_the_scenes_centre(tl_server):
    dated, dated_tags = pool(tl_server, date="2024-06-30")
    undated, undated_tags = pool(tl_server)
    with rasterio.open(SAMPLE_SCENE) as src:
        lon, lat = src.lnglat()
    assert (dated_tags["acquisition_date"], dated_tags["acquisition_date_source"]) == ("2024-06-30", "date given")
    assert dated_tags["model_time_coords"] == "2024,182"  # 30 June 2024: day 182 of a leap year
    assert dated_tags["model_location_coords"] == undated_tags["model_location_coords"] == f"{lat:.6f},{lon:.6f}"
    assert undated_tags["model_time_coords"] == "none (no acquisition date)"
    assert "acquisition_date" not in undated_tags  # the sample carries no date of its own
    assert not np.array_equal(dated, undated)  # the date reached the model
    assert tl_server.output().count("without its time encoding") == 1  # the undated request, once
