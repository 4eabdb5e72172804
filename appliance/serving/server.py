"""`appliance serve`: the pipeline behind LitServe, one engine fed by every request (docs/serving.md).

Processes (LitServe's): this main process supervises; one HTTP process (uvicorn) runs the routes; one
inference worker runs the `EngineLoop`. The main process stops them on SIGTERM after a drain (new
requests get 503, in-flight ones get `server.drain_timeout_s` to finish) and exits 0, or exits 1 when
the engine died (so an orchestrator restarts the server).
"""
import logging
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import threading
import time
from contextlib import contextmanager
from typing import Iterator

from omegaconf import DictConfig, OmegaConf

from appliance.errors import ConfigError
from appliance.heap import settle_heap
from appliance.pipeline import Pipeline
from appliance.progress import silence
from appliance.serving import litserve_adapter
from appliance.serving.split import OnlinePipeline, split_online
from appliance.serving.startup import check_media_dir, check_port_free, url
from appliance.serving.state import DEAD, READY, SharedState

log = logging.getLogger(__name__)


def serve(cfg: DictConfig, pipeline: Pipeline) -> int:
    pipeline.check()
    if cfg.server.stream_interval < 1:
        raise ConfigError(f"server.stream_interval: {cfg.server.stream_interval}; allowed: 1 or more "
                          "(tokens per streamed chunk)")
    if cfg.server.preprocess_workers < 0:
        raise ConfigError(f"server.preprocess_workers: {cfg.server.preprocess_workers}; allowed: 0 (the default "
                          "for the pipeline's kind) or more")
    check_media_dir(cfg.server.allowed_local_media_dir)
    online = split_online(pipeline, cfg)  # a pipeline the server cannot feed fails here, before any start-up
    silence(online.stages())
    check_port_free(cfg.server.host, cfg.server.port)  # before anything says we serve there
    from appliance.serving.metrics import multiprocess_dir

    with multiprocess_dir(), spool_directory(cfg.server.spool_dir) as spool:
        return _serve(cfg, online, spool)


def _serve(cfg: DictConfig, online: OnlinePipeline, spool: str) -> int:
    import litserve as ls
    from fastapi.exceptions import HTTPException as FastAPIHTTPException
    from starlette.exceptions import HTTPException

    from appliance.serving.http import openapi
    from appliance.serving.engine_process.api import EngineAPI
    from appliance.serving.http.errors import (LITSERVE_HEALTH, LITSERVE_INFO, APIError, api_error_handler,
                                               http_exception_handler)
    from appliance.serving.http.middleware import Gate
    from appliance.serving.http.spec import ApplianceSpec

    shared = SharedState()
    # The HTTP process and the engine loop talk over two pipes of ours, not LitServe's queues: those are
    # multiprocessing.Manager queues, an IPC round trip through LitServe's manager process per message
    # each way (docs/serving.md).
    requests_rx, requests_tx = mp.Pipe(duplex=False)
    events_rx, events_tx = mp.Pipe(duplex=False)
    container = OmegaConf.to_container(cfg, resolve=True)
    spec = ApplianceSpec(cfg, container, shared, spool, online, requests_tx, events_rx)
    gate = {"routes": spec.route_paths(), "metrics": spec.frontend.http_metrics,
            "max_bytes": int(cfg.server.limits.max_request_bytes),
            "api_key": cfg.server.api_key or os.environ.get("APPLIANCE_API_KEY")}
    # One inference worker whatever the device: the engine places itself (engine.device, TP ranks).
    # LitServe always adds its own health and info routes; ours answer /health, so its go elsewhere
    # (where the Gate answers 404: http/errors.py).
    server = ls.LitServer(EngineAPI(cfg, online, shared, spec, requests_rx, events_tx), accelerator="cpu",
                          timeout=False, middlewares=[(Gate, gate)],
                          healthcheck_path=LITSERVE_HEALTH, info_path=LITSERVE_INFO)
    for error, handler in ((APIError, api_error_handler), (HTTPException, http_exception_handler),
                           (FastAPIHTTPException, http_exception_handler)):
        server.app.add_exception_handler(error, handler)
    openapi.install(server.app)
    litserve_adapter.without_worker_monitor(server)  # the Supervisor watches the engine (exit code, drain)
    address = url(cfg.server.host, cfg.server.port)
    supervisor = Supervisor(server, shared, float(cfg.server.drain_timeout_s),
                            ready_line=f"ready: pipeline {cfg.pipeline.name} on {address} (model loaded, warm-up done)")
    signal.signal(signal.SIGTERM, lambda signum, frame: supervisor.drain())
    threading.Thread(target=supervisor.watch, name="supervisor", daemon=True).start()
    log.info("starting pipeline %s (%s), model %s, on %s: loading the model", cfg.pipeline.name, online.kind,
             cfg.model.name, address)
    settle_heap()  # before LitServe forks the HTTP process, which inherits the frozen heap
    # uvicorn logs at warning, so its access log never prints; access_log=False also stops it formatting
    # each request's line before the logger drops it.
    server.run(host=cfg.server.host, port=cfg.server.port, num_api_servers=1, generate_client_file=False,
               log_level="warning", access_log=False, api_server_worker_type="process")
    return supervisor.exit_code


class Supervisor:
    """Stops the server when asked (SIGTERM, after draining) or when the engine dies (exit code 1)."""

    def __init__(self, server, shared: SharedState, drain_timeout_s: float, ready_line: str = "ready"):
        self.server, self.shared, self.drain_timeout_s = server, shared, drain_timeout_s
        self.ready_line = ready_line
        self.announced = False
        self.announcing = threading.Lock()  # the watcher and the drain may both see the engine ready
        self.exit_code = 0
        self.stopping = threading.Event()

    def drain(self) -> None:
        if not self.shared.draining:
            self.shared.start_draining()
            threading.Thread(target=self._drain, name="drain", daemon=True).start()

    def _drain(self) -> None:
        deadline = time.monotonic() + self.drain_timeout_s
        while self.shared.inflight and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.shared.inflight:
            log.warning("drain: %d requests still running after server.drain_timeout_s=%g s; stopping anyway",
                        self.shared.inflight, self.drain_timeout_s)
        self.announce_ready()  # a server stopped just after it became ready still said so
        self.stop()

    def announce_ready(self) -> None:
        with self.announcing:
            if not self.announced and self.shared.phase == READY:
                log.info(self.ready_line)
                self.announced = True

    def watch(self) -> None:
        while not self.stopping.is_set():
            self.announce_ready()
            workers = getattr(self.server, "inference_workers", None) or []
            if self.shared.phase == DEAD or any(not w.is_alive() for w in workers):
                log.error("the engine stopped; shutting the server down")
                self.shared.set_phase(DEAD)  # /health answers 503 until the HTTP process stops
                self.exit_code = 1
                self.stop()
                return
            time.sleep(0.2)

    def stop(self) -> None:
        self.stopping.set()
        litserve_adapter.request_stop(self.server)


@contextmanager
def spool_directory(configured) -> Iterator[str]:
    """Where uploads and outputs in flight live: `server.spool_dir`, else a private temp directory."""
    if configured:
        os.makedirs(configured, exist_ok=True)
        yield configured
        return
    path = tempfile.mkdtemp(prefix="appliance-spool-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
