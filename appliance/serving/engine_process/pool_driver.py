"""Pooling requests (GeoTIFF scenes) on the engine loop: tiles of every request share engine batches.

Each request runs the pipeline's online stages (`raster_read -> tile -> normalize -> engine -> stitch ->
raster_write`) in a preparer thread, with the `engine` stage replaced by an `EngineBridge`, which batches
as `appliance run` does (stages/pooling.py) through the request's `PoolSession`: tiles go to the loop's
inbox (at most two batches of one request in flight, so memory stays bounded), the loop adds them through
the engine stage (the engine's one handle) to the one `PoolEngine`, and each step's outputs go back to
their requests' threads, which stitch and write as offline. An abort stops the request's thread at its
next tile and drops its tiles from the engine; the writer's cleanup removes its temp file.

A scene job (`/v1/scenes`) asks for more: with `progress`, `TileProgress` events (once when the tile
plan is known, then at most once per engine step, when its count changed); with `report_dir`, the
scene report (stages/geo/scene_report.py) written by its thread after the mask, its summary in the
answer. `/pooling` and `/v1/pool` jobs ask for neither.

A request is running once a preparer thread has taken it, waiting until then: the HTTP side's queue bound
(`server.limits.max_queued_requests`) counts the waiting ones, so excess scenes get 429, not a place in
an ever longer line.
"""
import logging
import queue
import threading
import time
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import torch

from appliance.engine.geo_coords import COORDS_FIELD
from appliance.errors import UserError
from appliance.pipeline import Pipeline, Record, Stage
from appliance.serving.messages import Done, Failed, PoolJob, TileProgress
from appliance.serving.engine_process.inbox import Finished, TileReady, Unanswerable
from appliance.serving.engine_process.records import SceneRecord, as_record
from appliance.serving.engine_process.stats_log import StatsLog, pool_line
from appliance.serving.engine_process.driver import Driver
from appliance.stages.engine_stage import EngineStage
from appliance.stages.pooling import SERVED_BATCHES_IN_FLIGHT, pool_in_order

log = logging.getLogger(__name__)


class RequestCancelled(Exception):
    """Raised in a request's thread when its client went away."""


class PoolSession:
    def __init__(self, uid: str, arrival: float, job: PoolJob, driver: "PoolDriver"):
        self.uid, self.arrival, self.job, self.driver = uid, arrival, job, driver
        self.results: "queue.Queue[Tuple[int, Any]]" = queue.Queue()
        self.cancelled = threading.Event()
        self.started = False  # set by the preparer thread that runs it
        self.tiles = 0  # run by the engine so far (the request log's count)
        self.tiles_total: Optional[int] = None  # the scene's planned tiles, once its first tile arrived
        self.reported: Optional[int] = None  # `tiles` as the last TileProgress said (progress jobs)

    # ---- the request thread's port (stages/pooling.py) ------------------------------------------------
    def submit(self, seq: int, item: torch.Tensor, record: Record) -> None:
        if self.cancelled.is_set():
            raise RequestCancelled()
        total = getattr(record.get("tile"), "count", None)  # a TileRef
        self.driver.post(TileReady(self.uid, seq, item, total, record.get(COORDS_FIELD)))

    def collect(self, wait: bool) -> Dict[int, Any]:
        done: Dict[int, Any] = {}
        while wait or not self.results.empty():
            seq, output = self.results.get()
            if seq < 0:
                raise RequestCancelled()
            done[seq], wait = output, False
        return done

    def cancel(self) -> None:
        self.cancelled.set()
        self.results.put((-1, None))


class EngineBridge(Stage):
    """Stands in for the `engine` stage inside one request's thread (see the module docstring)."""

    name = "engine"

    def __init__(self, session: PoolSession, input_field: str, output_field: str, window: int):
        super().__init__(None, session.driver.cfg)  # no options; the served pipeline's config
        self.session, self.input, self.output, self.window = session, input_field, output_field, window

    def process(self, records: Iterator[Record]) -> Iterator[Record]:
        return pool_in_order(records, self.session, self.input, self.output, self.window)


class PoolDriver(Driver):
    def message_handlers(self) -> Dict[type, Callable[[Any], None]]:
        return {**super().message_handlers(), TileReady: self.on_tile, Finished: self.on_finished}

    def start(self) -> None:
        stage = self.online.engine
        if not isinstance(stage, EngineStage):
            raise RuntimeError("the served pipeline has no engine stage to pool with")
        self.stage = stage  # the engine's one handle: tiles are added, stepped and aborted through it
        self.input_field, self.output_field = stage.options.input, stage.options.output
        self.window = SERVED_BATCHES_IN_FLIGHT * stage.pooling_engine().cfg.max_batch_size
        self.stages = Pipeline(self.online.stages(), ready=True)
        self.engine_index = len(self.online.head)
        self.sessions: Dict[str, PoolSession] = {}
        self.tiles: Dict[str, Tuple[str, int]] = {}  # engine request id -> (uid, seq)
        self.stats_log = StatsLog(self.cfg.server.stats_interval_s, ("tiles",), pool_line)
        item = warmup_item(self.cfg, self.online)
        if item is not None:  # one forward, so the first request pays no start-up costs
            list(self.stage.process(iter([{self.input_field: item}])))

    # ---- requests -------------------------------------------------------------------------------
    def admit(self, uid: str, arrival: float, job: PoolJob) -> None:
        session = PoolSession(uid, arrival, job, self)
        self.sessions[uid] = session
        self.executor.submit(self._run, session)

    def _run(self, session: PoolSession) -> None:
        """In a preparer thread: the scene's description (URLs: read by windows, never downloaded whole), then
        the online stages with the bridge; post the result."""
        job = session.job
        session.started = True
        self.metrics.queue.observe(time.monotonic() - session.arrival)
        source = job.input_path
        # geo modules (rasterio) only where a geo request runs: a llava_encode server never loads them
        from appliance.stages.geo.multidate import model_frames
        from appliance.stages.geo.scene_sources import SceneSpec
        from appliance.stages.geo.served_scenes import (allowed_s3_buckets, local_scene_spec, named_error,
                                                        request_fields, served_scene_spec, upload_scene_spec)

        frames = model_frames(self.cfg)
        try:
            if job.input_url is not None or isinstance(source, list) or job.upload:
                from appliance.fetch import FetchPolicy

                geo = self.cfg.model.geo
                if job.input_url is not None:
                    policy = FetchPolicy.from_server_config(self.cfg.server)
                    buckets = allowed_s3_buckets(self.cfg.server)
                    source = served_scene_spec(job.input_url, geo, policy, job.field, buckets, frames)
                elif job.upload:
                    source = upload_scene_spec(source, job.field, list(geo.bands), frames)
                else:
                    source = local_scene_spec(source, geo, job.field, frames)
            record = as_record(SceneRecord(source, job.output_path, job.quicklook, job.bands, job.aoi, job.date))
            bridge = EngineBridge(session, self.input_field, self.output_field, self.window)
            last: Optional[Record] = None
            for last in self.stages.replaced(self.engine_index, bridge).run([record]):  # noqa: B007 - keeps the last
                pass
            result = {"display": (last or {}).get("display")}
            if job.report_dir is not None:
                result["scene"] = self._report(session, last, job.report_dir)
            self.post(Finished(session.uid, result))
        except RequestCancelled:
            pass
        except Exception as e:  # noqa: BLE001 - every failure becomes the client's answer
            if isinstance(e, UserError):  # name the request's field, never a server path
                paths = job.input_path if isinstance(job.input_path, list) else [job.input_path]
                spec = source if isinstance(source, SceneSpec) else None
                fields = request_fields(job.input_url or job.input_path, job.field, spec, frames)
                e = named_error(e, job.field, fields, [p for p in paths if p])
            self.post(Unanswerable(session.uid, self.failure(e, "running the scene")))
        finally:
            reads = getattr(source, "fetch", None)  # a URL's RemoteReads: its kept connections end here
            if reads is not None:
                reads.close()

    def _report(self, session: PoolSession, last: Optional[Record], report_dir: str) -> Dict[str, Any]:
        """The scene report of the mask just written (previews into the job's report_dir); its summary."""
        from appliance.stages.geo.scene_report import write_scene_report

        if session.cancelled.is_set():  # aborted while the mask was written: its files are being removed
            raise RequestCancelled()
        if last is None:
            raise RuntimeError("the scene's pipeline ended without the record of its mask")
        return write_scene_report(last["scene"], session.job.output_path, report_dir,
                                  self.cfg.server.scenes.preview_size)

    def on_tile(self, message: TileReady) -> None:
        session = self.sessions.get(message.uid)
        if session is None:
            return  # aborted: its remaining tiles never reach the engine
        self.tiles[self.stage.add_item(message.tile, message.coords)] = (message.uid, message.seq)
        if session.tiles_total is None and message.total is not None:
            session.tiles_total = message.total
            self.report_progress(session)

    def report_progress(self, session: PoolSession) -> None:
        """A progress job's TileProgress, when the total is known and the count changed since the last."""
        if session.job.progress and session.tiles_total is not None and session.tiles != session.reported:
            session.reported = session.tiles
            self.emit(session.uid, TileProgress(session.tiles, session.tiles_total))

    def on_finished(self, message: Finished) -> None:
        session = self.sessions.pop(message.uid, None)
        if session is not None:
            self.metrics.e2e.observe(time.monotonic() - session.arrival)
            self.metrics.pool_request("success").inc()
            self.emit(message.uid, Done({**message.result, "tiles": session.tiles}))

    def abort(self, uid: str) -> None:
        if self.forget(uid):
            self.metrics.pool_request("abort").inc()

    def forget(self, uid: str) -> bool:
        session = self.sessions.pop(uid, None)
        if session is None:
            return False
        session.cancel()
        for request_id in [r for r, (owner, _) in self.tiles.items() if owner == uid]:
            self.stage.abort(request_id)
            del self.tiles[request_id]
        return True

    def fail(self, uid: str, failure: Failed) -> None:
        if self.forget(uid):
            self.metrics.pool_request("failed").inc()
            self.emit(uid, failure)

    # ---- the step -------------------------------------------------------------------------------
    def busy(self) -> bool:
        return self.stage.has_unfinished()

    def step(self) -> None:
        if self.stage.has_unfinished():
            outputs = self.stage.step()
            self.stats_log.add("tiles", len(outputs))
            advanced: Dict[str, PoolSession] = {}
            for out in outputs:
                owner = self.tiles.pop(out.request_id, None)
                if owner is None:
                    continue
                uid, seq = owner
                session = self.sessions.get(uid)
                if session is not None:
                    session.results.put((seq, out.output[0]))
                    session.tiles += 1
                    advanced[session.uid] = session
                    self.metrics.tiles.inc()
            for session in advanced.values():
                self.report_progress(session)
        running = sum(session.started for session in self.sessions.values())
        self.shared.set_running(running)
        self.metrics.running.set(running)
        self.metrics.waiting.set(len(self.sessions) - running)
        now = time.monotonic()
        if self.stats_log.due(now):
            self.stats_log.write(now, {"running": running, "waiting": len(self.sessions) - running})

    def fail_all(self, failure: Failed) -> None:
        for uid in list(self.sessions):
            self.fail(uid, failure)

    def fail_stepping(self, failure: Failed) -> None:
        for uid in {owner for owner, _ in self.tiles.values()}:
            self.fail(uid, failure)


def warmup_item(cfg, online) -> Optional[torch.Tensor]:
    """A zero tile shaped as the `tile` stage cuts them ([C, T, S, S] for a T-date model), with the model's
    bands; None if unknown."""
    tile = next((s for s in online.head if s.name == "tile"), None)
    geo = cfg.model.get("geo")
    if tile is None or geo is None:
        log.info("no tile stage or model.geo: the pool engine starts without a warm-up forward")
        return None
    from appliance.stages.geo.multidate import model_frames

    size, frames = tile.tile_size, model_frames(cfg)
    return torch.zeros(len(geo.bands), frames, size, size) if frames > 1 else torch.zeros(len(geo.bands), size, size)
