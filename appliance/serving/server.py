"""`appliance serve`: the pipeline behind LitServe, one engine fed by every request (docs/serving.md).

Processes (LitServe's): this main process supervises; one HTTP process (uvicorn) runs the routes; one
inference worker runs the `EngineLoop`. The main process alone acts on SIGTERM and SIGINT, however they
are delivered (stop_signals.py): the first drains (new requests get 503, in-flight ones get
`server.drain_timeout_s` to finish), a second stops at once; then it stops the other processes and exits
0. It exits 1 when the engine died (so an orchestrator restarts the server), and 2 when another process
answers on its address.
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
from http.client import HTTPConnection
from typing import Any, Dict, Iterator, Optional, cast

from omegaconf import DictConfig, OmegaConf

from appliance.errors import ConfigError
from appliance.gc_tuning import settle_heap
from appliance.pipeline import Pipeline
from appliance.progress import silence
from appliance.serving import litserve_adapter
from appliance.serving.online_stages import OnlinePipeline, split_online
from appliance.serving.startup import check_server_settings, claim_port, url
from appliance.serving.stop_signals import STOP_SIGNALS, start_deaf_thread
from appliance.serving.state import DEAD, READY, SharedState
from appliance.words import counted

log = logging.getLogger(__name__)


def serve(cfg: DictConfig, pipeline: Pipeline) -> int:
    check_server_settings(cfg)  # first: the settings cost nothing to check, the model's files seconds
    pipeline.check()
    online = split_online(pipeline, cfg)  # a pipeline the server cannot feed fails here, before any start-up
    silence(online.stages())
    from appliance.serving.metrics import multiprocess_dir

    # claimed before anything says we serve there
    with claim_port(cfg.server.host, cfg.server.port), multiprocess_dir(), \
            spool_directory(cfg.server.spool_dir) as spool:
        return _serve(cfg, online, spool)


def _serve(cfg: DictConfig, online: OnlinePipeline, spool: str) -> int:
    import litserve as ls
    from fastapi.exceptions import HTTPException as FastAPIHTTPException
    from starlette.exceptions import HTTPException

    from appliance.serving.http import openapi
    from appliance.serving.engine_process.api import EngineAPI
    from appliance.serving.http.cors import cors_middleware
    from appliance.serving.http.errors import LITSERVE_HEALTH, LITSERVE_INFO, APIError, RouteErrors, api_error_handler
    from appliance.serving.http.middleware import Gate
    from appliance.serving.http.pages import Pages
    from appliance.serving.http.process_link import ProcessLink
    from appliance.serving.http.spec import ApplianceSpec

    shared = SharedState()
    # The HTTP process and the engine loop talk over two pipes of ours, not LitServe's queues: those are
    # multiprocessing.Manager queues, an IPC round trip through LitServe's manager process per message
    # each way (docs/serving.md).
    requests_rx, requests_tx = mp.Pipe(duplex=False)
    events_rx, events_tx = mp.Pipe(duplex=False)
    container = cast(Dict[str, Any], OmegaConf.to_container(cfg, resolve=True))  # a DictConfig's: a dict
    spec = ApplianceSpec(cfg, container, shared, spool, online, requests_tx, events_rx)
    api_key = cfg.server.api_key or os.environ.get("APPLIANCE_API_KEY")
    gate = {"routes": spec.routes, "metrics": spec.frontend.http_metrics,
            "max_bytes": int(cfg.server.limits.max_request_bytes), "api_key": api_key,
            "access_log": bool(cfg.server.access_log)}
    # Middlewares, innermost first: the pages (ahead of LitServe's `GET /`), the Gate, the link to the
    # main process, and outermost CORS where origins are listed (a preflight carries no key).
    middlewares = [(Pages, {"routes": spec.pages}), (Gate, gate),
                   (ProcessLink, {"frontend": spec.frontend, "shared": shared}),
                   *cors_middleware(list(cfg.server.cors_origins), spec.routes)]
    # One inference worker whatever the device: the engine places itself (engine.device, TP ranks).
    # LitServe always adds its own health and info routes; ours answer /health, so its go elsewhere
    # (where the Gate answers 404: http/errors.py). /openapi.json is our route (the route table's), so
    # FastAPI adds neither it nor its CDN-loading /docs.
    server = ls.LitServer(EngineAPI(cfg, online, shared, spec, requests_rx, events_tx), accelerator="cpu",
                          timeout=False, middlewares=middlewares, disable_openapi_url=True,
                          healthcheck_path=LITSERVE_HEALTH, info_path=LITSERVE_INFO)
    route_errors = RouteErrors(spec.routes).http_exception
    for error, handler in ((APIError, api_error_handler), (HTTPException, route_errors),
                           (FastAPIHTTPException, route_errors)):
        server.app.add_exception_handler(error, handler)
    openapi.install(server.app, spec.routes.routes, keyed=bool(api_key))
    litserve_adapter.without_worker_monitor(server)  # the Supervisor watches the engine (exit code, drain)
    address = url(cfg.server.host, cfg.server.port)
    supervisor = Supervisor(server, shared, float(cfg.server.drain_timeout_s),
                            address=(cfg.server.host, cfg.server.port),
                            ready_line=f"ready: pipeline {cfg.pipeline.name} on {address} (model loaded, warm-up done)")
    for signum in STOP_SIGNALS:
        signal.signal(signum, supervisor.on_signal)
    threading.Thread(target=supervisor.watch, name="supervisor", daemon=True).start()
    log.info("starting pipeline %s (%s), model %s, on %s: loading the model", cfg.pipeline.name, online.kind.value,
             cfg.model.name, address)
    settle_heap()  # before LitServe forks the HTTP process, which inherits the frozen heap
    failures = []

    def run() -> None:
        # uvicorn logs at warning and its access log is off (the Gate writes ours: server.access_log);
        # log_config=None keeps its handlers and format out: its records reach ours (appliance/logs.py).
        try:
            server.run(host=cfg.server.host, port=cfg.server.port, num_api_servers=1, generate_client_file=False,
                       log_level="warning", access_log=False, log_config=None, api_server_worker_type="process")
        except BaseException as e:  # noqa: BLE001 - raised again in the main thread
            failures.append(e)

    # On its own thread, so that every process LitServe starts is deaf to stop signals and the main thread
    # (which Python runs signal handlers on) stays free to take them.
    start_deaf_thread(run, "litserve").join()
    if failures:
        raise failures[0]
    if supervisor.failure is not None:
        raise supervisor.failure
    if supervisor.outcome:
        log.info(supervisor.outcome)
    return supervisor.exit_code


class Supervisor:
    """Stops the server: after a drain on the first SIGTERM or SIGINT, at once on a second; when the engine
    dies (exit code 1); when another process answers on the server's address (a ConfigError, exit 2)."""

    def __init__(self, server, shared: SharedState, drain_timeout_s: float, address=("127.0.0.1", 8000),
                 ready_line: str = "ready"):
        self.server, self.shared, self.drain_timeout_s = server, shared, drain_timeout_s
        self.address, self.ready_line = address, ready_line
        self.announced = False
        self.exit_code = 0
        self.failure: Optional[Exception] = None
        self.outcome = ""  # the line said once every process stopped
        self.signals: list[str] = []  # names of the stop signals received, in order
        self.stop_now = threading.Event()
        self.stopping = threading.Event()

    def on_signal(self, signum, frame=None) -> None:
        """The signal handler (main thread): as little as possible here, the drain thread does the rest."""
        self.signals.append(signal.Signals(signum).name)
        if len(self.signals) == 1:
            self.shared.start_draining()
            threading.Thread(target=self._drain, name="drain", daemon=True).start()
        else:
            self.stop_now.set()

    def _drain(self) -> None:
        first = self.signals[0]
        running = self.shared.inflight
        log.info("%s: draining: new requests get 503, %d running get up to server.drain_timeout_s=%g s; "
                 "a second signal stops at once", first, running, self.drain_timeout_s)
        deadline = time.monotonic() + self.drain_timeout_s
        while self.shared.inflight and time.monotonic() < deadline and not self.stop_now.wait(0.05):
            pass
        cut = self.shared.inflight
        finished = max(0, running - cut)
        if self.stop_now.is_set():
            log.info("%s again: stopping now", self.signals[-1])
            why = f"at once on a second signal ({self.signals[-1]})"
        elif cut:
            why = f"on {first} after server.drain_timeout_s={self.drain_timeout_s:g} s"
        else:
            why = f"on {first}"
        self.outcome = (f"stopped {why}: {counted(finished, 'request')} finished, {cut} cut"
                        + (" (ended with a 503)" if cut else ""))
        self.stop()

    def watch(self) -> None:
        while not self.stopping.is_set():
            if self.shared.phase == READY and not self.announced and not self.shared.draining:
                self._announce_when_reachable()
            workers = getattr(self.server, "inference_workers", None) or []
            if self.shared.phase == DEAD or any(not w.is_alive() for w in workers):
                log.error("the engine stopped; shutting the server down")
                self.shared.set_phase(DEAD)  # /health answers 503 until the HTTP process stops
                self.exit_code = 1
                self.stop()
                return
            time.sleep(0.2)

    def _announce_when_reachable(self) -> None:
        """Say ready once a request to our address reached our own HTTP process; fail if another process
        answered there (two servers raced for one port: only the first could listen)."""
        if not reaches_a_server(*self.address):
            return  # our HTTP process is not listening yet
        if self.shared.listening:
            log.info(self.ready_line)
            self.announced = True
            return
        host, port = self.address
        self.failure = ConfigError(f"server.port: another process answers on {host}:{port}, so this server "
                                   "cannot listen there; stop it or pass server.port=N")
        self.exit_code = 2
        self.stop()

    def stop(self) -> None:
        self.stopping.set()
        # Before LitServe sends its SIGTERMs: a child whose parent's SIGTERM was merged into someone else's
        # pending one reads this instead (stop_signals.py).
        self.shared.mark_stopping()
        litserve_adapter.request_stop(self.server)


def reaches_a_server(host: str, port: int) -> bool:
    """True when an HTTP server answers GET /health on host:port (a wildcard host is asked on loopback)."""
    target = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    connection = HTTPConnection(target, port, timeout=5)
    try:
        connection.request("GET", "/health")
        connection.getresponse().read()
        return True
    except OSError:
        return False
    finally:
        connection.close()


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
