"""Which of a pipeline's stages the server runs, and where the engine sits among them.

`appliance serve` takes requests from HTTP bodies and shapes its own answers, so it runs only the
stages marked `online` (not the offline sources and sinks such as `chat_requests`, `raster_inputs`,
`chat_responses`). Around the `engine` stage they form a head (request preparation, run in the worker
pool) and a tail (after the engine: stitching and writing for pooling models).
"""
from dataclasses import dataclass
from typing import List, Optional

from appliance.config.schema import EngineKind
from appliance.errors import ConfigError
from appliance.pipeline import Pipeline, Stage, check_graph
from appliance.serving.engine_process.records import record_fields



@dataclass
class OnlinePipeline:
    kind: str                   # "generate" | "pool" | "plain" (no engine stage: POST /predict)
    head: List[Stage]
    engine: Optional[Stage]
    tail: List[Stage]

    def stages(self) -> List[Stage]:
        return [*self.head, *([self.engine] if self.engine else []), *self.tail]


def split_online(pipeline: Pipeline, cfg) -> OnlinePipeline:
    """The online stages around the engine; ConfigError when the server could not feed them."""
    engines = [s for s in pipeline.stages if s.name == "engine"]
    if not engines:
        return OnlinePipeline("plain", list(pipeline.stages), None, [])
    if len(engines) > 1:
        raise ConfigError(f"pipeline.stages: {len(engines)} engine stages ({', '.join(s.id for s in engines)}); "
                          "a server runs one engine")
    index = pipeline.stages.index(engines[0])
    head = [s for s in pipeline.stages[:index] if s.online]
    tail = [s for s in pipeline.stages[index + 1:] if s.online]
    kind = "pool" if cfg.engine.kind == EngineKind.pool else "generate"
    if kind == "generate" and tail:
        raise ConfigError(f"pipeline.stages.{tail[0].id} ({tail[0].name}) follows a generating engine; the server "
                          "streams the engine's tokens itself, so only offline stages may follow it")
    # A generating engine is fed by the chat head or, for /v1/completions, by the body's prompt.
    check_graph([*head, engines[0], *tail], record_fields(kind), f"the {kind} API",
                fed=lambda stage: stage.name == "engine" and kind == "generate")
    return OnlinePipeline(kind, head, engines[0], tail)
