"""Command-line overrides of stage options: `pipeline.stages.<id>.<option>=<value>`.

Hydra applies an override only to a key the composed tree already has (or to a new one with `+`), but a
stage's options are declared by its `Options` dataclass, not by the pipeline's YAML, which states only
what the pipeline changes. So `compose` takes these overrides away from Hydra and applies them here,
after Hydra composed the tree and before the stage nodes are checked against their `Options`:

  pipeline.stages.tile.overlap=64        set an option (a misspelt one is refused by the check)
  ~pipeline.stages.tile.overlap          back to the option's default
  pipeline.stages.tile.stage=NAME        run another registered stage under this id
  +pipeline.stages.extra={stage: NAME}   append a stage;  ~pipeline.stages.extra  drop one

Values use Hydra's override grammar (the same parser): lists, mappings, null, `${...}` interpolations.
"""
from typing import List, Sequence, Tuple

from hydra.core.override_parser.types import Override
from omegaconf import DictConfig, OmegaConf, open_dict

from appliance.errors import ConfigError

STAGES_KEY = "pipeline.stages"


def split_stage_overrides(parsed: Sequence[Override]) -> Tuple[List[str], List[Override]]:
    """(override lines for Hydra, the overrides of `pipeline.stages.<id>...` for `apply_stage_overrides`)."""
    hydra, stages = [], []
    for override in parsed:
        if override.package is None and override.key_or_group.startswith(STAGES_KEY + "."):
            stages.append(override)
        else:
            hydra.append(override.input_line)
    return hydra, stages


def apply_stage_overrides(cfg: DictConfig, overrides: Sequence[Override]) -> None:
    """Apply each override, in order, to `cfg.pipeline.stages`; ConfigError for an id the pipeline
    does not have (listing those it has)."""
    if not overrides:
        return
    stages = cfg.pipeline.stages
    if not isinstance(stages, DictConfig):
        raise ConfigError(f"{STAGES_KEY}: expected a mapping from stage id to options, got "
                          f"{type(stages).__name__}; see conf/pipeline/*.yaml")
    with open_dict(cfg):
        for override in overrides:
            _apply(cfg, stages, override)


def _apply(cfg: DictConfig, stages: DictConfig, override: Override) -> None:
    line = override.input_line
    key = override.key_or_group
    stage_id, _, option = key[len(STAGES_KEY) + 1:].partition(".")
    if stage_id not in stages:
        if override.is_add() and not override.is_delete():
            stages[stage_id] = {}
        else:
            raise ConfigError(_unknown_id(stage_id, option, stages, cfg.pipeline.get("name")))
    if stages[stage_id] is None:
        stages[stage_id] = {}
    if override.is_delete():
        parent_key, _, leaf = key.rpartition(".")
        parent = OmegaConf.select(cfg, parent_key)
        if not isinstance(parent, DictConfig) or leaf not in parent:
            raise ConfigError(f"{line}: the pipeline does not set {key}, so it has its default already")
        del parent[leaf]
        return
    OmegaConf.update(cfg, key, override.value(), merge=True, force_add=True)


def _unknown_id(stage_id: str, option: str, stages: DictConfig, pipeline: str) -> str:
    ids = list(stages.keys())
    hint = ""
    if stage_id.isdigit() and int(stage_id) < len(ids):  # the old list syntax: stages by position
        hint = (f"; stages are addressed by id, not position: "
                f"{STAGES_KEY}.{ids[int(stage_id)]}{'.' + option if option else ''}=...")
    elif option:
        hint = f"; to append a stage: +{STAGES_KEY}.{stage_id}.stage=NAME"
    return f"{STAGES_KEY}.{stage_id}: pipeline {pipeline} has no stage '{stage_id}' (stages: {', '.join(ids)}){hint}"
