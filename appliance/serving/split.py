"""Which of a pipeline's stages the server runs, and where the engine sits among them.

`appliance serve` takes requests from HTTP bodies and shapes its own answers, so it runs only the
stages marked `online` (not the offline sources and sinks such as `chat_requests`, `raster_inputs`,
`chat_responses`). Around the `engine` stage they form a head (request preparation, run in the worker
pool) and a tail (after the engine: stitching and writing for pooling models).
"""
from dataclasses import dataclass
from typing import Iterable, List, Optional

from appliance.config.schema import EngineKind
from appliance.errors import ConfigError
from appliance.pipeline import Pipeline, Stage

# Record fields each protocol hands the online stages.
GENERATE_FIELDS = ("messages", "sampling", "where", "media_dir", "custom_id", "model_name")
POOL_FIELDS = ("input_path", "output_path", "scene_index", "overwrite", "quicklook", "bands")


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
    fields = POOL_FIELDS if kind == "pool" else GENERATE_FIELDS
    _check_graph(fields, [*head, engines[0], *tail], kind)
    return OnlinePipeline(kind, head, engines[0], tail)


def _check_graph(fields: Iterable[str], stages: List[Stage], kind: str) -> None:
    available = set(fields)
    for stage in stages:
        # A generating engine is fed by the chat head or, for /v1/completions, by the body's prompt.
        missing = [] if stage.name == "engine" and kind == "generate" else \
            sorted(set(stage.consumes) - available)
        if missing:
            raise ConfigError(f"pipeline.stages.{stage.id} ({stage.name}) needs {', '.join(missing)}, which neither "
                              f"the {kind} API nor an earlier online stage provides")
        available |= set(stage.produces)
