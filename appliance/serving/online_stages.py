"""Which of a pipeline's stages the server runs, and where the engine sits among them.

`appliance serve` takes requests from HTTP bodies and shapes its own answers, so it runs only the
stages marked `online` (not the offline sources and sinks such as `chat_requests`, `raster_inputs`,
`chat_responses`). Around the `engine` stage they form a head (request preparation, run in the worker
pool) and a tail (after the engine: stitching and writing for pooling models).
"""
from dataclasses import dataclass
from enum import Enum
from typing import List, Optional

from appliance.config.schema import EngineKind
from appliance.errors import ConfigError
from appliance.pipeline import Pipeline, Stage, check_graph
from appliance.serving.engine_process.records import record_fields



class ServedKind(str, Enum):
    """What a server serves: its engine's kind, or `plain` (a pipeline with no engine stage: POST /predict),
    which is no engine kind."""

    generate = EngineKind.generate.value
    pool = EngineKind.pool.value
    plain = "plain"


@dataclass
class OnlinePipeline:
    kind: ServedKind
    head: List[Stage]
    engine: Optional[Stage]
    tail: List[Stage]

    def stages(self) -> List[Stage]:
        return [*self.head, *([self.engine] if self.engine else []), *self.tail]


def split_online(pipeline: Pipeline, cfg) -> OnlinePipeline:
    """The online stages around the engine; ConfigError when the server could not feed them."""
    engines = [s for s in pipeline.stages if s.name == "engine"]
    if not engines:
        return OnlinePipeline(ServedKind.plain, list(pipeline.stages), None, [])
    if len(engines) > 1:
        raise ConfigError(f"pipeline.stages: {len(engines)} engine stages ({', '.join(s.id for s in engines)}); "
                          "a server runs one engine")
    index = pipeline.stages.index(engines[0])
    head = [s for s in pipeline.stages[:index] if s.online]
    tail = [s for s in pipeline.stages[index + 1:] if s.online]
    kind = cfg.engine.kind
    if kind is EngineKind.generate and tail:
        raise ConfigError(f"pipeline.stages.{tail[0].id} ({tail[0].name}) follows a generating engine; the server "
                          "streams the engine's tokens itself, so only offline stages may follow it")
    # A generating engine is fed by the chat head or, for /v1/completions, by the body's prompt.
    check_graph([*head, engines[0], *tail], record_fields(kind), f"the {kind.value} API",
                fed=lambda stage: stage.name == "engine" and kind is EngineKind.generate)
    return OnlinePipeline(ServedKind(kind.value), head, engines[0], tail)
