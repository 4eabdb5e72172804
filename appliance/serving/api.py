"""The LitAPI of `appliance serve`: it carries the config into LitServe's inference worker, where the
`EngineLoop` builds the worker for the pipeline's kind (generate, pool, or plain for engine-less ones).

LitServe pickles the API into its spawned worker, so it holds a plain config container, the shared
counters and the engine loop's ends of the two pipes (both travel with the process they are handed to),
never a built pipeline.
"""
import litserve as ls
from omegaconf import OmegaConf

from appliance.serving.loop import EngineLoop
from appliance.serving.state import SharedState


class EngineAPI(ls.LitAPI):
    def __init__(self, cfg_container: dict, shared: SharedState, spec: ls.specs.base.LitSpec, requests, events):
        super().__init__(spec=spec, loop=EngineLoop())
        self.cfg_container = cfg_container
        self.shared = shared
        self.requests = requests  # the pipe's end jobs and aborts arrive on, from the HTTP process
        self.events = events      # the pipe's end the loop sends each turn's events on

    def setup(self, device) -> None:
        """Nothing here: the engine loop loads the model, so the HTTP server starts at once."""

    def build_worker(self):
        from appliance.pipeline import build_pipeline
        from appliance.serving.generate_worker import GenerateWorker
        from appliance.serving.metrics import EngineMetrics
        from appliance.serving.plain_worker import PlainWorker
        from appliance.serving.pool_worker import PoolWorker
        from appliance.serving.split import split_online

        cfg = OmegaConf.create(self.cfg_container)
        pipeline = build_pipeline(cfg)
        online = split_online(pipeline, cfg)
        for stage in online.stages():
            stage.setup()
        kind = {"generate": GenerateWorker, "pool": PoolWorker, "plain": PlainWorker}[online.kind]
        metrics = EngineMetrics(cfg.server.served_model_name or cfg.model.name)
        return kind(cfg, online, metrics, self.shared)
