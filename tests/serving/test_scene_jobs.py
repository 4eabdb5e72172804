"""The scene job registry of `/v1/scenes` (serving/http/scene_jobs.py), its body (protocol/scenes.py) and
how a job follows its events (routes_scenes.py), without a server: a clock the test moves, files in a temp
directory, events handed out by a stand-in for the Frontend."""
import asyncio
import logging
import os

import pytest
from omegaconf import OmegaConf

from appliance.errors import InputError
from appliance.protocol.scenes import SCENE_FILES, Scene, parse_scene_body
from appliance.serving.http.errors import APIError
from appliance.serving.http.routes_scenes import SceneRoutes
from appliance.serving.http.scene_jobs import DONE, FAILED, QUEUED, RUNNING, SceneJobs
from appliance.serving.messages import Done, TileProgress


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


def registry(tmp_path, clock, keep_s=60.0, max_kept=3) -> SceneJobs:
    return SceneJobs(str(tmp_path / "scenes"), keep_s, max_kept, clock=clock)


def write_outputs(job, names=SCENE_FILES):
    for name in names:
        with open(job.path(name), "wb") as f:
            f.write(b"x")
    with open(job.output_path + ".aux.xml", "wb") as f:
        f.write(b"x")


def test_a_job_moves_from_queued_to_running_to_done_and_its_counts_never_go_down(tmp_path, clock):
    jobs = registry(tmp_path, clock)
    job = jobs.add()
    assert job.id.startswith("scene-") and os.path.isdir(job.dir)
    assert (job.status, job.tiles_done, job.tiles_total) == (QUEUED, 0, None)
    job.progress(0, 20)
    assert (job.status, job.tiles_done, job.tiles_total) == (RUNNING, 0, 20)
    job.progress(12, 20)
    job.progress(9, 20)  # a late, smaller count
    assert job.tiles_done == 12
    write_outputs(job, ("mask.tif", "item.json", "scene.png"))
    job.succeed({"width": 1}, clock())
    assert (job.status, job.tiles_done, job.files) == (DONE, 20, ["mask.tif", "item.json", "scene.png"])
    assert job.finished_at == clock.now


def test_public_names_map_to_the_files_the_engine_writes(tmp_path, clock):
    job = registry(tmp_path, clock).add("scene-abc")
    assert job.path("mask.tif") == os.path.join(job.dir, "scene-abc.mask.tif")
    assert job.path("item.json") == os.path.join(job.dir, "scene-abc.mask.stac.json")  # stac_out's naming
    assert job.path("mask.png") == os.path.join(job.dir, "mask.png")
    assert job.download_name("mask.tif") == "scene-abc.mask.tif"
    assert job.download_name("item.json") == "scene-abc.mask.stac.json"


def test_the_scene_object_is_the_model(tmp_path, clock):
    jobs = registry(tmp_path, clock)
    queued = jobs.add()
    Scene.model_validate(queued.as_object())
    failed = jobs.add()
    failed.fail({"message": "body: not a GeoTIFF", "type": "BadRequestError", "param": "body", "code": 400}, clock())
    scene = Scene.model_validate(failed.as_object())
    assert scene.status == FAILED and scene.error.param == "body" and scene.files == []


def test_finished_jobs_are_forgotten_keep_s_after_they_finished_with_their_files(tmp_path, clock):
    jobs = registry(tmp_path, clock, keep_s=60)
    done, running = jobs.add(), jobs.add()
    write_outputs(done)
    done.succeed(None, clock())
    running.progress(1, 5)
    clock.now += 59
    jobs.prune()
    assert jobs.get(done.id) is done
    clock.now += 1
    jobs.prune()
    assert jobs.get(done.id) is None and not os.path.exists(done.dir)
    clock.now += 1e6
    jobs.prune()
    assert jobs.get(running.id) is running and os.path.isdir(running.dir)  # running jobs are never pruned


def test_at_most_max_kept_finished_jobs_stay_the_oldest_finished_go_first(tmp_path, clock):
    jobs = registry(tmp_path, clock, max_kept=2)
    first, second, third, running = jobs.add(), jobs.add(), jobs.add(), jobs.add()
    for job in (second, first, third):  # finished in this order
        clock.now += 1
        job.succeed(None, clock())
    jobs.prune()
    assert [job.id for job in jobs.newest_first()] == [running.id, third.id, first.id]
    assert not os.path.exists(second.dir)


def test_forget_deletes_the_files_and_prune_deletes_directories_no_job_owns(tmp_path, clock):
    jobs = registry(tmp_path, clock)
    job = jobs.add()
    write_outputs(job)
    jobs.forget(job)
    assert jobs.get(job.id) is None and not os.path.exists(job.dir)
    stray = tmp_path / "scenes" / "scene-left-from-before"
    stray.mkdir()
    (stray / "scene.png").write_bytes(b"x")
    kept = jobs.add()
    jobs.prune()
    assert not stray.exists() and os.path.isdir(kept.dir)


def test_a_failed_jobs_files_and_its_input_are_removed(tmp_path, clock):
    jobs = registry(tmp_path, clock)
    job = jobs.add()
    job.inputs = job.date_input_paths(3)
    assert [os.path.basename(p) for p in job.inputs] == ["input.date1.tif", "input.date2.tif", "input.date3.tif"]
    for path in job.inputs:
        with open(path, "wb") as f:
            f.write(b"scene")
    write_outputs(job, ("mask.tif",))
    jobs.remove_outputs(job)
    assert not os.path.exists(job.dir)


@pytest.mark.parametrize("body,param,fragment", [
    ({}, "url", "url: "),
    ({"url": ""}, "url", "url: "),
    ({"url": 5}, "url", "url: "),
    ({"url": "https://example.com/a.tif", "aoi": [1, 2, 3, 4]}, "aoi", "aoi: unknown field"),
    (["https://example.com/a.tif"], None, "body: expected a JSON object"),
    ({"url": "https://example.com/a.tif", "date": 20240630}, "date", "date: "),
])
def test_a_bad_json_body_names_its_field(body, param, fragment):
    with pytest.raises(InputError) as info:
        parse_scene_body(body)
    assert info.value.param == param and str(info.value).startswith(fragment), str(info.value)


def test_a_good_json_body_is_its_url_and_date():
    parsed = parse_scene_body({"url": "s3://bucket/scene.tif"})
    assert (parsed.url, parsed.date) == ("s3://bucket/scene.tif", None)
    assert parse_scene_body({"url": "https://example.com/a.tif", "date": "2024-06-30"}).date == "2024-06-30"


class Events:
    """A Frontend stand-in for one job: hands out `events` in order (an exception is raised, as
    `next_event` raises the deadline's 504) and records `close`."""

    def __init__(self, events):
        self.events, self.closed = list(events), []

    async def next_event(self, channel):
        event = self.events.pop(0)
        if isinstance(event, Exception):
            raise event
        return event

    def close(self, channel):
        self.closed.append(channel)


def scene_routes(tmp_path, events):
    cfg = OmegaConf.create({"server": {"scenes": {"keep_s": 900.0, "max_kept": 16, "preview_size": 1024},
                                       "limits": {"max_request_bytes": 1000}, "allowed_s3_buckets": []}})
    return SceneRoutes(Events(events), cfg, str(tmp_path))


def test_a_jobs_events_move_it_to_done_and_it_keeps_its_input_for_the_maps_tiles(tmp_path):
    routes = scene_routes(tmp_path, [TileProgress(0, 2), TileProgress(2, 2), Done({"scene": {"width": 4}})])
    job = routes.jobs.add()
    job.inputs = [job.input_path]
    with open(job.input_path, "wb") as f:
        f.write(b"scene")
    write_outputs(job, ("mask.tif", "item.json"))
    asyncio.run(routes._follow(job, "channel"))
    assert (job.status, job.tiles_done, job.tiles_total, job.result) == (DONE, 2, 2, {"width": 4})
    assert job.files == ["mask.tif", "item.json"] and os.path.exists(job.input_path)
    assert routes.frontend.closed == ["channel"]


def test_a_job_past_its_deadline_fails_with_the_504_and_keeps_no_files(tmp_path, caplog):
    deadline = APIError(504, "the request took longer than server.limits.request_timeout_s=1 s and was stopped")
    routes = scene_routes(tmp_path, [TileProgress(1, 9), deadline])
    job = routes.jobs.add()
    write_outputs(job, ("mask.tif",))
    with caplog.at_level(logging.WARNING):
        asyncio.run(routes._follow(job, "channel"))
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", f"scene {job.id} failed: {deadline.message}")], "one line with the scene's id and reason"
    assert job.status == FAILED and job.error["code"] == 504 and "request_timeout_s" in job.error["message"]
    assert Scene.model_validate(job.as_object()).error.type
    assert not os.path.exists(job.dir) and routes.frontend.closed == ["channel"]  # close aborts it in the engine
