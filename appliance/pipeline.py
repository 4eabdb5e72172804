"""Stages and the pipeline that chains them.

A stage is a small class registered under a name. It declares the record fields it consumes and
produces, and its options as a dataclass. A pipeline is the list of stage nodes from
`pipeline.stages`; records (plain dicts) stream through the stages as generators, so a stage can
batch (the engine), fan out (tiling) or fan in (stitching) while memory stays bounded.
"""
import importlib
import itertools
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, ClassVar, Dict, Iterable, Iterator, List, Set, Tuple, Type

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from appliance.errors import ConfigError

Record = Dict[str, Any]


@dataclass
class NoOptions:
    pass


class Stage:
    name: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions
    # Instances may narrow or widen these in __init__ when they depend on options.
    consumes: Tuple[str, ...] = ()
    produces: Tuple[str, ...] = ()
    # False for a stage of the offline verb only: a source that expands the run record (input files) or a
    # sink that prints or writes the run's answers. `appliance serve` takes requests from HTTP bodies and
    # shapes answers itself, and runs only the online stages (appliance/serving/pipeline_split.py).
    online: ClassVar[bool] = True

    def __init__(self, options: Any, cfg: DictConfig):
        """Cheap: parse options and remember config. Never load weights here (`check` builds stages)."""
        self.options = options
        self.cfg = cfg

    def check(self) -> None:
        """Validate files this stage will need (exist, readable, consistent); load no weights."""

    def setup(self) -> None:
        """Load heavy resources (weights, processors). Called once before the first record."""

    def process(self, records: Iterator[Record]) -> Iterator[Record]:
        for record in records:
            yield self.map(record)

    def map(self, record: Record) -> Record:
        raise NotImplementedError(f"stage '{self.name}' must implement map() or process()")

    def close(self) -> None:
        """Release resources (engine workers, open files)."""


STAGES: Dict[str, Type[Stage]] = {}


def register_stage(cls: Type[Stage]) -> Type[Stage]:
    if not cls.name:
        raise TypeError(f"{cls.__qualname__} needs a `name`")
    if cls.name in STAGES and STAGES[cls.name] is not cls:
        raise TypeError(f"stage name '{cls.name}' is already registered by {STAGES[cls.name].__qualname__}")
    if not is_dataclass(cls.Options):
        raise TypeError(f"{cls.__qualname__}.Options must be a dataclass")
    STAGES[cls.name] = cls
    return cls


class Pipeline:
    def __init__(self, stages: List[Stage], ready: bool = False):
        """`ready=True`: the stages are set up already (a server's per-request view of its stages)."""
        self.stages = stages
        self._ready: Set[int] = set(range(len(stages))) if ready else set()  # stages whose setup() has run

    def replaced(self, index: int, stage: Stage) -> "Pipeline":
        """The same stages, set up as they are, with the one at `index` swapped for `stage` (set up)."""
        clone = Pipeline([*self.stages[:index], stage, *self.stages[index + 1:]])
        clone._ready = {*self._ready, index}
        return clone

    def check(self) -> None:
        for stage in self.stages:
            stage.check()

    def setup(self) -> None:
        """Set every stage up now (a server does this before it reports healthy)."""
        for index in range(len(self.stages)):
            self._setup(index)

    def run(self, records: Iterable[Record]) -> Iterator[Record]:
        """Chain the stages. A stage not yet set up is set up when its first record arrives, so bad
        input found by early stages is reported before any weights load."""
        stream: Iterator[Record] = iter(records)
        for index in range(len(self.stages)):
            stream = self._process(index, stream)
        return stream

    def _process(self, index: int, stream: Iterator[Record]) -> Iterator[Record]:
        first = next(stream, None)
        if first is None:
            return
        self._setup(index)
        yield from self.stages[index].process(itertools.chain([first], stream))

    def _setup(self, index: int) -> None:
        if index not in self._ready:
            self.stages[index].setup()
            self._ready.add(index)

    def close(self) -> None:
        for index in sorted(self._ready, reverse=True):
            self.stages[index].close()
        self._ready.clear()


def build_pipeline(cfg: DictConfig) -> Pipeline:
    """Build every stage from its node and check the graph; loads no weights."""
    import appliance.stages  # noqa: F401  (registers the built-in stages)

    for module in cfg.plugins:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(f"plugins: cannot import '{module}': {e}") from None

    available = set(cfg.pipeline.inputs)
    stages = []
    for index, node in enumerate(cfg.pipeline.stages):
        where = f"pipeline.stages[{index}]"
        stage = _build_stage(where, node, cfg)
        missing = [f for f in stage.consumes if f not in available]
        if missing:
            raise ConfigError(
                f"{where} ({stage.name}) consumes {', '.join(repr(f) for f in missing)}, which no earlier "
                f"stage produces (available: {', '.join(sorted(available))})"
            )
        available |= set(stage.produces)
        stages.append(stage)
    return Pipeline(stages)


def _build_stage(where: str, node: Any, cfg: DictConfig) -> Stage:
    if not isinstance(node, (dict, DictConfig)) or "stage" not in node:
        raise ConfigError(f"{where}: expected a mapping with a 'stage' key, got {node!r}")
    name = node["stage"]
    if name not in STAGES:
        raise ConfigError(f"{where}.stage: unknown stage '{name}' (registered: {', '.join(sorted(STAGES))})")
    cls = STAGES[name]
    raw = {k: v for k, v in OmegaConf.to_container(OmegaConf.create(dict(node)), resolve=True).items()
           if k != "stage"}
    try:
        merged = OmegaConf.merge(OmegaConf.structured(cls.Options), raw)
        options = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or getattr(e, "key", "")
        allowed = ", ".join(f.name for f in fields(cls.Options)) or "none"
        message = str(e).splitlines()[0]
        if "not in" in message:
            message = f"unknown option for stage '{name}' (allowed: {allowed})"
        raise ConfigError(f"{where}.{key}: {message}") from None
    return cls(options, cfg)

