"""`/v1/scenes` of pooling pipelines: a scene posted as a job, answered 202 at once, polled for its tiles,
its summary and files read once it is done (protocol/scenes.py has the shapes, docs/serving.md the API).

A job is a `PoolJob` whose channel is tied to no connection (Frontend.open with no request): an asyncio
task per job reads its events (TileProgress: the counts; Done: the summary and files; Failed, or the
deadline: the error) and closes the channel; the job keeps a reference to its task. DELETE cancels the
task, whose `close` aborts the job in the engine as a client leaving `/v1/pool` does, then deletes the
files. A date (`?date=` with a GeoTIFF body, `"date"` in a JSON one) is checked as `/v1/pool`'s before the
job queues. A multi-date model's scene (stages/geo/multidate.py) is `{"urls": [date 1, ..., date T]}` (its
count checked here, by multidate.py's function), a form of T GeoTIFFs (`multipart/form-data`, form_body.py:
each date spooled to its own file, the job's input the list of them, whose problems name `files[i]`), or one
stacked file by `url` or as the body; its dates a list. Every route first prunes the finished jobs past
`server.scenes.keep_s` / `max_kept` (scene_jobs.py).
"""
import asyncio
import logging
import os
from typing import Any, Tuple

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse

from appliance.errors import InputError
from appliance.protocol.openai_responses import error_body, new_id
from appliance.protocol.scenes import SCENE_FILES, parse_scene_body
from appliance.serving.http.errors import APIError, read_json
from appliance.serving.http.form_body import DATE, FILES, spool_form
from appliance.serving.http.frontend import Frontend
from appliance.serving.http.body_types import content_type
from appliance.serving.http.geotiff_body import (checked_dates, query_dates, refuse_unknown_query,
                                                 spool_body, unsupported_body)
from appliance.serving.http.route_table import FORM, GEOTIFF_TYPES
from appliance.serving.http.scene_jobs import DONE, SceneJob, SceneJobs
from appliance.serving.messages import Done, Failed, PoolJob, TileProgress
from appliance.stages.geo.multidate import check_date_count, model_bands, model_frames
from appliance.stages.geo.served_scenes import allowed_s3_buckets, check_served_href

log = logging.getLogger(__name__)

JSON_TYPE = "application/json"
QUERY = ("date",)  # POST's query parameters (the GeoTIFF body's date; a JSON body carries its own)
MEDIA = {"mask.tif": "image/tiff", "item.json": "application/geo+json", "scene.png": "image/png",
         "mask.png": "image/png"}
DOWNLOADS = ("mask.tif", "item.json")  # answered as attachments; the previews show inline


class SceneRoutes:
    def __init__(self, frontend: Frontend, cfg, spool_dir: str):
        scenes = cfg.server.scenes
        self.frontend = frontend
        self.jobs = SceneJobs(os.path.join(spool_dir, "scenes"), float(scenes.keep_s), int(scenes.max_kept))
        self.max_bytes = int(cfg.server.limits.max_request_bytes)
        self.s3_buckets = allowed_s3_buckets(cfg.server)
        self.frames, self.model_bands = model_frames(cfg), model_bands(cfg)

    # ---- routes ---------------------------------------------------------------------------------
    async def create(self, request: Request):
        self.jobs.prune()
        scene_id = new_id("scene")
        request.state.request_id = scene_id  # the request log's id (access_log.py)
        refuse_unknown_query(request, QUERY)
        kind = content_type(request)
        url, field, date = None, "body", query_dates(request)
        if kind == JSON_TYPE:
            if date is not None:
                raise APIError(400, 'date: with a JSON body give the date in it: {"url": ..., "date": "YYYY-MM-DD"}',
                               param="date")
            url, field, date = self._url(await read_json(request))
        elif kind == FORM:
            self._check_form(date)
            field = FILES
        elif kind not in GEOTIFF_TYPES:
            raise unsupported_body(kind, self.frames, '{"url": ...}')
        date = checked_dates(date, self.frames, "date")
        job = self.jobs.add(scene_id)
        try:
            if kind == FORM:
                job.inputs = job.date_input_paths(self.frames)
                form = await spool_form(request, job.inputs)
                date = checked_dates(form.date, self.frames, DATE)
            elif url is None:
                job.inputs = [job.input_path]
                await spool_body(request, job.input_path)
            channel = self.frontend.open(job.id, None)  # 429 / 503 as every route
        except BaseException:
            self.jobs.forget(job)
            raise
        uploaded = job.inputs if kind == FORM else job.input_path  # several dates' files, or one file
        self.frontend.submit(channel, PoolJob(
            None if url else uploaded, url, job.output_path, field,
            upload=url is None, date=date, report_dir=job.dir, progress=True))
        job.task = asyncio.get_running_loop().create_task(self._follow(job, channel))
        return JSONResponse(job.as_object(), status_code=202, headers={"Location": f"scenes/{job.id}"})

    async def list(self, request: Request):
        self.jobs.prune()
        return JSONResponse({"object": "list", "data": [job.as_object() for job in self.jobs.newest_first()],
                             "max_request_bytes": self.max_bytes, "keep_s": self.jobs.keep_s,
                             "max_kept": self.jobs.max_kept, "frames": self.frames})

    async def get(self, request: Request):
        self.jobs.prune()
        return JSONResponse(self._job(request).as_object())

    async def file(self, request: Request):
        self.jobs.prune()
        job = self._job(request)
        name = request.path_params["file"]
        if name not in SCENE_FILES:
            raise APIError(404, f"file: {name!r}: no such file; a scene's files are {', '.join(SCENE_FILES)}",
                           param="file")
        self.jobs.require_done(job)
        if name not in job.files:
            raise APIError(404, f"file: scene {job.id!r} has no {name} (it has {', '.join(job.files) or 'none'})",
                           param="file")
        return FileResponse(job.path(name), media_type=MEDIA[name],
                            filename=job.download_name(name) if name in DOWNLOADS else None)

    async def delete(self, request: Request):
        self.jobs.prune()
        job = self._job(request)
        if job.task is not None and not job.task.done():
            job.task.cancel()  # its `finally` closes the channel: the engine drops the job's tiles
            await asyncio.gather(job.task, return_exceptions=True)
        self.jobs.forget(job)
        return JSONResponse({"id": job.id, "object": "scene", "deleted": True})

    # ---- a job's events -------------------------------------------------------------------------
    async def _follow(self, job: SceneJob, channel) -> None:
        try:
            while True:
                event = await self.frontend.next_event(channel)
                if isinstance(event, TileProgress):
                    job.progress(event.tiles_done, event.tiles_total)
                elif isinstance(event, Done):
                    job.succeed(event.result.get("scene"), self.jobs.now())
                    return
                elif isinstance(event, Failed):
                    job.fail(error_body(event.status, event.message, event.param)["error"], self.jobs.now())
                    return
        except APIError as e:  # the deadline passed: `close` aborts it
            job.fail(error_body(e.status, e.message, e.param)["error"], self.jobs.now())
        except Exception:  # a bug here must not leave the job running forever
            log.exception("scene %s: reading its events failed", job.id)
            job.fail(error_body(500, "the server failed while following this scene")["error"], self.jobs.now())
        finally:
            self.frontend.close(channel)
            if job.status != DONE:  # a done job keeps its input: its map tiles read it
                self.jobs.remove_outputs(job)

    # ---- helpers --------------------------------------------------------------------------------
    def _check_form(self, date) -> None:
        """A form carries a multi-date model's dates, each its own file, and their dates in it."""
        if self.frames == 1:
            raise APIError(400, "body: a multipart/form-data form carries the dates of a multi-date model, but this "
                                "model takes one date: post the GeoTIFF itself as the body with Content-Type: "
                                'image/tiff, or {"url": ...} as application/json', param="body")
        if date is not None:
            raise APIError(400, f"date: with a form give the dates in its {DATE} field: {DATE}=d1,d2,...",
                           param="date")

    def _job(self, request: Request) -> SceneJob:
        return self.jobs.named(request.path_params["id"])

    def _url(self, body) -> Tuple[Any, str, Any]:
        """The JSON body's scene (`url`, or `urls`: a multi-date model's dates, counted), checked against the
        server's policy, the field naming it, and its date(s) as sent."""
        try:
            parsed = parse_scene_body(body, self.frames)
            if parsed.urls is not None:
                check_date_count(parsed.urls, self.frames, self.model_bands, "urls")
                for i, href in enumerate(parsed.urls):
                    check_served_href(href, f"urls[{i}]", self.s3_buckets)  # server policy before the job queues
                return parsed.urls, "urls", parsed.date
            url = parsed.url
            if url is None:  # parse_scene_body refuses a body with neither
                raise RuntimeError("parse_scene_body passed a body with neither url nor urls")
            check_served_href(url, "url", self.s3_buckets)
        except InputError as e:
            raise APIError.from_input(e) from None
        return url, "url", parsed.date
