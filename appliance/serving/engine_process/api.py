"""The LitAPI of `appliance serve`: it carries the pipeline's online stages (built, not set up) into
LitServe's inference worker, where `setup` makes the driver for the pipeline's kind and the
`EngineLoop` loads the engine and runs it.

LitServe pickles the API into its spawned worker: it holds the config, the online stages (what they
share is made again in that process: `pipeline.Shared`), the shared counters and the engine loop's
ends of the two pipes (both travel with the process they are handed to).
"""
import litserve as ls

from appliance.serving.engine_process.loop import EngineLoop
from appliance.serving.online_stages import OnlinePipeline
from appliance.serving.state import SharedState


class EngineAPI(ls.LitAPI):
    def __init__(self, cfg, online: OnlinePipeline, shared: SharedState, spec: ls.specs.base.LitSpec,
                 requests, events):
        super().__init__(spec=spec, loop=EngineLoop())
        self.cfg = cfg
        self.online = online
        self.shared = shared
        self.requests = requests  # the pipe's end jobs and aborts arrive on, from the HTTP process
        self.events = events      # the pipe's end the loop sends each turn's events on
        self.driver = None

    def setup(self, device) -> None:
        """The driver for the pipeline's kind; loads no weights (the engine loop does, so the HTTP server
        answers /health while they load). `device`: the engine places itself (engine.device, TP ranks).
        This spawned process inherits no logging: it sets up the same format as the others first."""
        from appliance.logs import SERVE_LEVEL, setup_logging

        setup_logging(self.cfg.log_level or SERVE_LEVEL, self.cfg.log_format)
        from appliance.stages.build import load_stages
        from appliance.serving.engine_process.generate_driver import GenerateDriver
        from appliance.serving.metrics import EngineMetrics, MetricNames
        from appliance.serving.engine_process.plain_driver import PlainDriver
        from appliance.serving.engine_process.pool_driver import PoolDriver
        from appliance.serving.online_stages import ServedKind

        load_stages(self.cfg.plugins)  # a plugin may register models, not only the stages unpickled here
        kind = {ServedKind.generate: GenerateDriver, ServedKind.pool: PoolDriver,
                ServedKind.plain: PlainDriver}[self.online.kind]
        metrics = EngineMetrics(self.cfg.server.served_model_name or self.cfg.model.name,
                                MetricNames(self.cfg.server.metrics_names))
        self.driver = kind(self.cfg, self.online, metrics, self.shared)

    async def authorize(self) -> None:
        """LitServe's auth hook, which every route depends on. The API key is checked before it, by the
        Gate middleware (http/middleware.py), for every path. Without this hook LitServe's default is a
        plain function, which FastAPI runs on a worker thread: a thread hand-off per request, a share of
        the HTTP process's CPU worth saving for short requests; a coroutine runs on the event loop."""
