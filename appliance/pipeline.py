"""Stages and the pipeline that chains them.

A stage is a small class registered under a name. It declares the record fields it consumes and
produces, and its options as a dataclass declared beside it (`<Stage>Options`, set as its `Options`;
`NoOptions` when it has none). A pipeline is `pipeline.stages`: an ordered mapping from stage id to
that stage's node, `{stage: <registered name>, <option>: <value>, ...}`; `stage` defaults to the id, so
`tile: {overlap: 64}` is the `tile` stage and `pipeline.stages.tile.overlap=64` overrides it. Records
(plain dicts) stream through the stages as generators, so a stage can batch (the engine), fan out
(tiling) or fan in (stitching) while memory stays bounded.
"""
import itertools
import threading
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Callable, ClassVar, Dict, Iterable, Iterator, List, Optional, Set, Tuple, Type, Union

from omegaconf import DictConfig

from appliance.errors import ConfigError

Record = Dict[str, Any]


@dataclass
class NoOptions:
    pass


@dataclass(frozen=True)
class ResolvedOptions:
    """A stage's options as it runs them: each option left None to be derived is set, and said where from."""

    options: Any
    from_model: Dict[str, str] = field(default_factory=dict)  # option -> the model fact it copies
    derived: Dict[str, str] = field(default_factory=dict)  # option -> the stage's rule that gave it


class Stage:
    name: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions
    # Instances may narrow or widen these in __init__ when they depend on options.
    consumes: Tuple[str, ...] = ()
    produces: Tuple[str, ...] = ()
    # False for a stage of the offline verb only: a source that expands the run record (input files) or a
    # sink that prints or writes the run's answers. `appliance serve` takes requests from HTTP bodies and
    # shapes answers itself, and runs only the online stages (appliance/serving/online_stages.py).
    online: ClassVar[bool] = True
    # True for a stage that acts once the run's records are through (it writes what they add up to): it
    # runs, on an empty stream, even when no record reaches it.
    runs_without_records: ClassVar[bool] = False

    def __init__(self, options: Any, cfg: DictConfig):
        """Cheap: parse options and check them against the config. Never load weights or read files
        here: `appliance config` builds every stage to validate its options. `self.options` are the
        options resolved (`resolve_options`): no None left that the stage derives."""
        self.options = self.resolve_options(options, cfg).options
        self.cfg = cfg
        self.id = self.name  # the key of its node in pipeline.stages (build_pipeline sets it)
        self.shared = Shared()  # build_pipeline hands every stage of one pipeline the same one

    @classmethod
    def options_for(cls, cfg: DictConfig) -> type:
        """The options dataclass a node takes under `cfg`: `Options`, unless which options apply depends on
        the config (the engine stage's on engine.kind); a field of `Options` not in it does not apply."""
        return cls.Options

    @classmethod
    def resolve_options(cls, options: Any, cfg: DictConfig) -> ResolvedOptions:
        """`options` with those whose None means "derive" (from the model's facts, or from other options)
        set to the values the stage will use: the stage runs these and `appliance config` prints them.
        Pure: the same options and config give the same values. A stage that derives none keeps them."""
        return ResolvedOptions(options)

    def check(self) -> None:
        """Validate files this stage will need (exist, readable, consistent); load no weights."""

    def preflight(self, records: List[Record]) -> Optional[List[Record]]:
        """The checks `process` would make of `records` that need no `setup` (no weights, tokenizer or
        network), through the same functions; then what `process` would pass on, when that is all of it
        and needed no setup (a run goes on from there), else None: the pipeline's preflight ends here."""
        return None

    def setup(self) -> None:
        """Load heavy resources (weights, processors). Called once before the first record."""

    def process(self, records: Iterator[Record]) -> Iterator[Record]:
        for record in records:
            yield self.map(record)

    def map(self, record: Record) -> Record:
        raise NotImplementedError(f"stage '{self.name}' must implement map() or process()")

    def process_each(self, records: List[Record]) -> List[Union[Record, Exception]]:
        """Each record's one output, or the error that stopped it; one record failing does not stop the
        others (the server's preparers run a group of requests this way). A stage that works faster on
        a batch overrides it."""
        return [attempt(lambda r: _only(self.process(iter([r]))), record) for record in records]

    def close(self) -> None:
        """Release resources (engine workers, open files)."""


class Shared:
    """What the stages of one pipeline share, each made once on first use (the model's tokenizer: the
    prompt stage renders with it, the engine detokenizes with it)."""

    def __init__(self):
        self._start_empty()

    def _start_empty(self) -> None:
        self._made: Dict[str, Any] = {}
        self._lock = threading.RLock()  # re-entrant: a value may be made from another (longest token <- tokenizer)

    def __getstate__(self):
        """Pickled (a server's stages travel to its engine process): made again in the new process."""
        return {}

    def __setstate__(self, state):
        self._start_empty()

    def get(self, key: str, make: Callable[[], Any]) -> Any:
        with self._lock:
            if key not in self._made:
                self._made[key] = make()
            return self._made[key]


STAGES: Dict[str, Type[Stage]] = {}


def register_stage(cls: Type[Stage]) -> Type[Stage]:
    if not cls.name:
        raise TypeError(f"{cls.__qualname__} needs a `name`")
    if cls.name in STAGES and STAGES[cls.name] is not cls:
        raise TypeError(f"stage name '{cls.name}' is already registered by {STAGES[cls.name].__qualname__}")
    if not is_dataclass(cls.Options):
        raise TypeError(f"{cls.__qualname__}.Options must be a dataclass")
    if "stage" in {f.name for f in fields(cls.Options)}:
        raise TypeError(f"{cls.__qualname__}.Options: 'stage' names the stage in its node; rename the option")
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

    def preflight(self, records: List[Record]) -> Tuple[int, List[Record]]:
        """Each stage's `preflight` in order, each fed what the one before passed on, up to the first that
        cannot tell its output: what `run` would refuse before any setup, found without one. Returns how
        many stages that went through and what the last passed on, for `run(..., start=)` to go on from."""
        for index, stage in enumerate(self.stages):
            passed = stage.preflight(records)
            if passed is None:
                return index, records
            records = passed
        return len(self.stages), records

    def setup(self) -> None:
        """Set every stage up now (a server does this before it reports healthy)."""
        for index in range(len(self.stages)):
            self._setup(index)

    def run(self, records: Iterable[Record], start: int = 0) -> Iterator[Record]:
        """Chain the stages, from stage `start` (`records`: what the stage before it passed on, as
        `preflight` returns). A stage not yet set up is set up when its first record arrives, so bad
        input found by early stages is reported before any weights load."""
        stream: Iterator[Record] = iter(records)
        for index in range(start, len(self.stages)):
            stream = self._process(index, stream)
        return stream

    def run_each(self, records: List[Record]) -> List[Union[Record, Exception]]:
        """Each record through every stage (`Stage.process_each`), or the error that stopped it."""
        results: List[Union[Record, Exception]] = list(records)
        for index, stage in enumerate(self.stages):
            going = [(i, result) for i, result in enumerate(results) if not isinstance(result, Exception)]
            if not going:
                break
            self._setup(index)
            for (i, _), result in zip(going, stage.process_each([record for _, record in going])):
                results[i] = result
        return results

    def _process(self, index: int, stream: Iterator[Record]) -> Iterator[Record]:
        first = next(stream, None)
        stage = self.stages[index]
        if first is None and not stage.runs_without_records:
            return
        self._setup(index)
        yield from stage.process(stream if first is None else itertools.chain([first], stream))

    def _setup(self, index: int) -> None:
        if index not in self._ready:
            self.stages[index].setup()
            self._ready.add(index)

    def close(self) -> None:
        for index in sorted(self._ready, reverse=True):
            self.stages[index].close()
        self._ready.clear()


def attempt(fn: Callable[..., Any], *args) -> Any:
    """fn(*args), or the Exception it raised."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - handed to whoever answers for the record
        return e


def _only(records: Iterator[Record]) -> Record:
    (record,) = records
    return record


def check_graph(stages: List[Stage], inputs: Iterable[str], source: str,
                fed: Callable[[Stage], bool] = lambda stage: False) -> None:
    """ConfigError unless each stage's `consumes` come from `inputs` (what `source` supplies) or an
    earlier stage's `produces`. `fed(stage)`: the stage gets its input another way (not checked)."""
    available = set(inputs)
    for stage in stages:
        missing = [] if fed(stage) else [f for f in stage.consumes if f not in available]
        if missing:
            raise ConfigError(
                f"pipeline.stages.{stage.id} ({stage.name}) consumes {', '.join(repr(f) for f in missing)}, which "
                f"neither {source} nor an earlier stage provides (available: {', '.join(sorted(available))})"
            )
        available |= set(stage.produces)
