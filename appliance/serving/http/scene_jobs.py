"""The scene jobs of `/v1/scenes` in the HTTP process: each job's state, its files, and how long it is kept.

A job's files live in `<spool>/scenes/<id>/`: the uploaded input (`input.tif`, or a form's dates
`input.date1.tif`, ...: the job's `inputs`, kept as long as the job: the map's scene tiles are read from
it), the mask the engine writes (`<id>.mask.tif`, with GDAL's `.aux.xml` and the STAC item
`<id>.mask.stac.json` beside it: stac_out's naming, so the item's asset href is the name the mask is
downloaded under), the previews (`scene.png`, `mask.png`) and `scene_rgb.json` (what scene.png shows).
Finished jobs (done or failed) are kept `keep_s` seconds after they finished and at most `max_kept` of
them (the oldest finished go first); `prune` applies both, and deletes directories no job owns (a server
restarted on the same spool, or an aborted job's writer that finished unwinding after its directory was
removed). The routes prune on every call, so an idle server keeps its files until the next one.
"""
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from appliance.protocol.openai_responses import new_id
from appliance.protocol.scenes import SCENE_FILES
from appliance.serving.http.errors import APIError
from appliance.stages.geo.stac_out import stac_path

QUEUED, RUNNING, DONE, FAILED = "queued", "running", "done", "failed"
INPUT_NAME = "input.tif"  # a GeoTIFF body
DATE_INPUT_NAME = "input.date{}.tif"  # a form's date i, from 1 (form_body.py)
log = logging.getLogger(__name__)


@dataclass
class SceneJob:
    id: str
    created: int                       # Unix time, for clients
    dir: str
    status: str = QUEUED
    tiles_done: int = 0
    tiles_total: Optional[int] = None
    error: Optional[Dict[str, Any]] = None   # an error body's `error` object
    result: Optional[Dict[str, Any]] = None  # the engine's summary (protocol.scenes.SceneSummary)
    files: List[str] = field(default_factory=list)
    inputs: List[str] = field(default_factory=list)  # the upload's spooled files (input_path, or date_input_paths)
    finished_at: Optional[float] = None      # time.monotonic() when it ended (done or failed)
    task: Any = None                         # the asyncio task reading its events (asyncio keeps weak references)

    @property
    def input_path(self) -> str:
        return os.path.join(self.dir, INPUT_NAME)

    def date_input_paths(self, dates: int) -> List[str]:
        """Where a form's `dates` files are spooled, in time order."""
        return [os.path.join(self.dir, DATE_INPUT_NAME.format(i)) for i in range(1, dates + 1)]

    @property
    def output_path(self) -> str:
        return os.path.join(self.dir, f"{self.id}.mask.tif")

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    def path(self, name: str) -> str:
        """Where the file a client calls `name` (one of SCENE_FILES) is."""
        if name == "mask.tif":
            return self.output_path
        if name == "item.json":
            return stac_path(self.output_path)
        return os.path.join(self.dir, name)

    def download_name(self, name: str) -> str:
        """The file's name on the client's disk: the names stac_out gives a mask called `<id>.mask.tif`."""
        return os.path.basename(self.path(name))

    def progress(self, tiles_done: int, tiles_total: int) -> None:
        self.status = RUNNING
        self.tiles_total = tiles_total
        self.tiles_done = max(self.tiles_done, tiles_done)  # clients never see the count go down

    def succeed(self, summary: Optional[Dict[str, Any]], now: float) -> None:
        self.status, self.result, self.finished_at = DONE, summary, now
        if self.tiles_total is not None:
            self.tiles_done = self.tiles_total
        self.files = [name for name in SCENE_FILES if os.path.isfile(self.path(name))]

    def fail(self, error: Dict[str, Any], now: float) -> None:
        self.status, self.error, self.finished_at = FAILED, error, now
        log.warning("scene %s failed: %s", self.id, error["message"])  # the access log saw only its 202

    def as_object(self) -> Dict[str, Any]:
        """The scene object of the API (protocol.scenes.Scene)."""
        return {"id": self.id, "object": "scene", "created": self.created, "status": self.status,
                "tiles_done": self.tiles_done, "tiles_total": self.tiles_total, "error": self.error,
                "result": self.result, "files": list(self.files)}


class SceneJobs:
    def __init__(self, root: str, keep_s: float, max_kept: int, clock: Callable[[], float] = time.monotonic):
        """`root`: the directory the jobs' directories go in (made on first use)."""
        self.root = root
        self.keep_s = keep_s
        self.max_kept = max_kept
        self.clock = clock
        self.jobs: Dict[str, SceneJob] = {}  # in the order they were posted

    def add(self, job_id: Optional[str] = None) -> SceneJob:
        """A new queued job with an empty directory of its own."""
        job_id = job_id or new_id("scene")
        job = SceneJob(job_id, int(time.time()), os.path.join(self.root, job_id))
        os.makedirs(job.dir)
        self.jobs[job_id] = job
        return job

    def get(self, job_id: str) -> Optional[SceneJob]:
        return self.jobs.get(job_id)

    def named(self, job_id: str) -> SceneJob:
        """The job `job_id`; else a 404 naming the `id`."""
        job = self.jobs.get(job_id)
        if job is None:
            raise APIError(404, f"scene {job_id!r}: no such scene (finished scenes are kept "
                                f"server.scenes.keep_s={self.keep_s:g} s)", param="id")
        return job

    @staticmethod
    def require_done(job: SceneJob) -> None:
        """A 409 unless the job is done: its files exist once it is."""
        if job.status != DONE:
            raise APIError(409, f"scene {job.id!r} is {job.status}; its files exist once it is done")

    def newest_first(self) -> List[SceneJob]:
        return list(reversed(self.jobs.values()))

    def now(self) -> float:
        return self.clock()

    def prune(self) -> None:
        """Forget the finished jobs past `keep_s` or beyond the newest `max_kept`, and stray directories."""
        now = self.clock()
        finished = sorted(((job.finished_at, job) for job in self.jobs.values() if job.finished_at is not None),
                          key=lambda pair: pair[0])
        for i, (finished_at, job) in enumerate(finished):
            if now - finished_at >= self.keep_s or len(finished) - i > self.max_kept:
                self.forget(job)
        if os.path.isdir(self.root):
            for name in os.listdir(self.root):
                if name not in self.jobs:
                    shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)

    def forget(self, job: SceneJob) -> None:
        """Delete the job's files and the job."""
        self.jobs.pop(job.id, None)
        shutil.rmtree(job.dir, ignore_errors=True)

    @staticmethod
    def remove_outputs(job: SceneJob) -> None:
        """A failed job keeps no files (a partial mask is no answer)."""
        shutil.rmtree(job.dir, ignore_errors=True)
