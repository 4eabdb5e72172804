"""A pipeline from the config: the registered stages (built-in and plugins'), each `pipeline.stages` node
checked against its stage's `Options`, the stages built and their graph checked. Loads no weights."""
import importlib
from dataclasses import dataclass, fields
from typing import Any, Dict, Iterable, List, Optional, Type, cast

from omegaconf import DictConfig, OmegaConf

from appliance.config.typed import typed_dataclass
from appliance.errors import ConfigError
from appliance.pipeline import STAGES, Pipeline, Shared, Stage, check_graph


def load_stages(plugins: Iterable[str]) -> None:
    """Register the built-in stages and those of `plugins` (modules imported for their stages)."""
    import appliance.stages  # noqa: F401  (registers the built-in stages)

    for module in plugins:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(f"plugins: cannot import '{module}': {e}") from None


@dataclass(frozen=True)
class StageNode:
    """One entry of `pipeline.stages`, checked: its id, its stage class and its options."""

    id: str
    cls: Type[Stage]
    options: Any  # an instance of cls.Options

    def normalized(self) -> Dict[str, Any]:
        """The node with its stage and every option spelled out (defaults included): what `appliance
        config` prints."""
        typed = OmegaConf.structured(self.options)
        return {"stage": self.cls.name, **cast(Dict[str, Any], OmegaConf.to_container(typed, enum_to_str=True))}


def stage_nodes(stages: Any, cfg: Optional[DictConfig] = None) -> List[StageNode]:
    """Each `pipeline.stages` entry checked against its stage's options (`Stage.options_for(cfg)`, or
    `Options` without a config); ConfigError naming `pipeline.stages.<id>.<key>`, the stage and what is
    allowed. Stages must be registered (`load_stages`)."""
    if not isinstance(stages, (dict, DictConfig)):
        raise ConfigError(f"pipeline.stages: expected a mapping from stage id to options, such as "
                          f"{{tile: {{overlap: 64}}}} (the id is the stage's name unless the node sets 'stage'), "
                          f"got {type(stages).__name__}")
    return [_stage_node(str(stage_id), node, cfg) for stage_id, node in stages.items()]


def _stage_node(stage_id: str, node: Any, cfg: Optional[DictConfig]) -> StageNode:
    where = f"pipeline.stages.{stage_id}"
    if node is None:
        node = {}
    if not isinstance(node, (dict, DictConfig)):
        raise ConfigError(f"{where}: expected a mapping of options ({{stage: NAME, option: value, ...}}; the "
                          f"'stage' key defaults to the id '{stage_id}'), got {node!r}")
    raw = cast(Dict[str, Any], OmegaConf.to_container(node, resolve=True)) if isinstance(node, DictConfig) \
        else dict(node)
    name = raw.pop("stage", None) or stage_id
    if name not in STAGES:
        registered = ", ".join(sorted(STAGES))
        if "stage" in node:
            raise ConfigError(f"{where}.stage: unknown stage '{name}' (registered: {registered})")
        raise ConfigError(f"{where}: unknown stage '{name}': the id names the stage unless the node sets a "
                          f"'stage' key (registered: {registered})")
    cls = STAGES[name]
    schema = cls.Options if cfg is None else cls.options_for(cfg)
    applying = [f.name for f in fields(schema)]
    for key in raw:
        if key not in applying and key in {f.name for f in fields(cls.Options)}:
            raise ConfigError(f"{where}.{key}: does not apply to stage '{name}' with "
                              f"{getattr(schema, 'applies_to', 'this config')} (its options there: "
                              f"{', '.join(applying) or 'none'})")
    options = typed_dataclass(schema, raw, where, f"option for stage '{name}'", f"stage '{name}'")
    return StageNode(stage_id, cls, options)


def build_stages(cfg: DictConfig) -> List[Stage]:
    """Every stage of `pipeline.stages`, built from its checked node (the stage's own option checks run
    in its constructor), sharing one `Shared`; loads no weights."""
    load_stages(cfg.plugins)
    shared = Shared()
    stages = []
    for node in stage_nodes(cfg.pipeline.stages, cfg):
        try:
            stage = node.cls(node.options, cfg)
        except ConfigError as e:
            raise ConfigError(_at_node(str(e), node)) from None
        stage.id, stage.shared = node.id, shared
        stages.append(stage)
    return stages


def _at_node(message: str, node: StageNode) -> str:
    """A stage names its options from its name (`tile.stride: ...`); say where the node is instead:
    `pipeline.stages.<id>.stride: ...`."""
    name = node.cls.name
    if message.startswith((f"{name}.", f"{name}:")):
        return f"pipeline.stages.{node.id}{message[len(name):]}"
    return f"pipeline.stages.{node.id}: {message}"


def build_pipeline(cfg: DictConfig) -> Pipeline:
    """Build every stage and check the graph (`check_graph`, fed by `pipeline.inputs`); loads no weights."""
    stages = build_stages(cfg)
    check_graph(stages, cfg.pipeline.inputs, "pipeline.inputs")
    return Pipeline(stages)
