"""Scene jobs on the engine side: the pool driver with the real flood pipeline and demo model, in this
process, its loop turns (inbox, step, events) driven by the test as the engine loop drives them. A job
with `progress` gets TileProgress counts that never go down and end at the scene's tile total; one with
`report_dir` gets the scene summary in its answer and the two previews; a `/v1/pool`-like job neither. A server
writes one file a scene even under `stitch.output:
classes_and_probabilities` (its routes answer, spool and delete one)."""
import contextlib
import json
import shutil
import time

import numpy as np
import pytest
import rasterio
from PIL import Image

from appliance.config.compose import compose
from appliance.serving.engine_process.inbox import Arrived
from appliance.serving.engine_process.pool_driver import PoolDriver
from appliance.serving.messages import Done, PoolJob, TileProgress
from appliance.serving.online_stages import split_online
from appliance.serving.state import SharedState
from appliance.stages.build import build_pipeline
from tests.servers import SAMPLE_SCENE

MAX_TURNS = 20_000  # each idle turn waits at most 0.05 s for the inbox: a stuck job ends the test, not CI
PREVIEW = 100


class AnyMetric:
    """Stands in for EngineMetrics (prometheus-client's multiprocess files belong to a server process):
    every metric, label and update is accepted and ignored."""

    def __getattr__(self, name):
        return self

    def __call__(self, *args, **kwargs):
        return self


@contextlib.contextmanager
def pool_driver(*overrides):
    # 128-pixel tiles make the 400x300 sample a dozen tiles; batches of 2 make them finish over several steps.
    cfg = compose(["pipeline=prithvi_flood", "pipeline.stages.tile.tile_size=128", "engine.max_batch_size=2",
                   f"server.scenes.preview_size={PREVIEW}", "server.stats_interval_s=0", *overrides])
    online = split_online(build_pipeline(cfg), cfg)
    for stage in online.stages():
        stage.setup()
    pool = PoolDriver(cfg, online, AnyMetric(), SharedState())
    pool.start()
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="module")
def driver():
    with pool_driver() as pool:
        yield pool


def run_job(driver, uid, job):
    """Every event the job got, in order, up to its final one."""
    driver.post(Arrived(uid, job, time.monotonic()))
    events = []
    for _ in range(MAX_TURNS):
        driver.drain_inbox(0 if driver.busy() else 0.05)
        driver.step()
        events += [event for owner, event in driver.take_events() if owner == uid]
        if events and events[-1].final:
            return events
    raise AssertionError(f"{uid} did not finish in {MAX_TURNS} turns; events: {events}")


def scene_job(tmp_path, name, **kwargs):
    upload = tmp_path / f"{name}.in.tif"
    shutil.copyfile(SAMPLE_SCENE, upload)
    return PoolJob(str(upload), None, str(tmp_path / f"{name}.tif"), "body", upload=True, **kwargs)


def test_progress_and_report_of_a_scene_job(driver, tmp_path):
    report = tmp_path / "report"
    report.mkdir()
    events = run_job(driver, "scene-1", scene_job(tmp_path, "mask", progress=True, report_dir=str(report)))
    *progress, done = events
    assert isinstance(done, Done), done
    assert progress and all(isinstance(event, TileProgress) for event in progress)
    done_counts = [event.tiles_done for event in progress]
    totals = {event.tiles_total for event in progress}
    assert len(totals) == 1 and totals.pop() == done.result["tiles"] > 1
    assert done_counts == sorted(done_counts) and len(set(done_counts)) == len(done_counts)  # up, never repeated
    assert done_counts[-1] == done.result["tiles"] and len(done_counts) > 2  # reported as the steps went

    summary = done.result["scene"]
    with rasterio.open(tmp_path / "mask.tif") as ds:
        mask = ds.read(1)
        assert [summary["width"], summary["height"], summary["crs"]] == [ds.width, ds.height, ds.crs.to_string()]
    counts = [int((mask == i).sum()) for i in range(2)]
    assert [c["pixels"] for c in summary["classes"]] == counts and summary["valid_pixels"] == sum(counts)
    assert summary["classes"][1]["share"] == pytest.approx(counts[1] / sum(counts))
    assert max(summary["preview"].values()) == PREVIEW
    for name in ("scene.png", "mask.png"):
        with Image.open(report / name) as image:
            assert image.size == (summary["preview"]["width"], summary["preview"]["height"])
    assert sorted(p.name for p in report.iterdir()) == ["mask.png", "scene.png", "scene_rgb.json"]  # no temp file
    shown = json.loads((report / "scene_rgb.json").read_text())
    assert len(shown["files"]) == len(shown["bands"]) == len(shown["ranges"]) == 3  # what the map's scene tiles read


def test_a_pool_job_gets_no_progress_and_no_report(driver, tmp_path):
    events = run_job(driver, "pool-1", scene_job(tmp_path, "plain"))
    assert len(events) == 1 and isinstance(events[0], Done)
    assert "scene" not in events[0].result and events[0].result["tiles"] > 1
    with rasterio.open(tmp_path / "plain.tif") as ds:
        assert np.isin(ds.read(1), [0, 1, 255]).all()


def test_a_served_scene_writes_the_class_map_alone_whatever_stitch_keeps(tmp_path):
    with pool_driver("pipeline.stages.stitch.output=classes_and_probabilities") as pool:
        events = run_job(pool, "pool-both", scene_job(tmp_path, "both"))
    assert len(events) == 1 and isinstance(events[0], Done)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["both.in.tif", "both.stac.json", "both.tif"]
    with rasterio.open(tmp_path / "both.tif") as ds:
        assert ds.count == 1 and ds.dtypes[0] == "uint8" and np.isin(ds.read(1), [0, 1, 255]).all()
    assets = json.loads((tmp_path / "both.stac.json").read_text())["assets"]
    assert list(assets) == ["mask"]
