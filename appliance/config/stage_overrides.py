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
from dataclasses import fields
from typing import List, Sequence, Tuple

from hydra.core.override_parser.types import Override
from omegaconf import DictConfig, OmegaConf, open_dict

from appliance.errors import ConfigError

STAGES_KEY = "pipeline.stages"


def override_text(override: Override) -> str:
    """The override as written; Hydra's parser keeps it on every override it returns."""
    if override.input_line is None:
        raise ConfigError(f"override of {override.key_or_group!r} came without its text")
    return override.input_line


def split_stage_overrides(parsed: Sequence[Override]) -> Tuple[List[str], List[Override]]:
    """(override lines for Hydra, the overrides of `pipeline.stages.<id>...` for `apply_stage_overrides`)."""
    hydra, stages = [], []
    for override in parsed:
        if override.package is None and override.key_or_group.startswith(STAGES_KEY + "."):
            stages.append(override)
        else:
            hydra.append(override_text(override))
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
    line = override_text(override)
    key = override.key_or_group
    stage_id, _, option = key[len(STAGES_KEY) + 1:].partition(".")
    if stage_id not in stages:
        if override.is_add() and not override.is_delete():
            stages[stage_id] = {}
        else:
            raise ConfigError(_unknown_id(override, stages, cfg))
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


def _unknown_id(override: Override, stages: DictConfig, cfg: DictConfig) -> str:
    """The stages the pipeline has and, when the override sets an option, the stages that have it."""
    stage_id, _, option = override.key_or_group[len(STAGES_KEY) + 1:].partition(".")
    ids = [str(stage) for stage in stages.keys()]
    value = override_text(override).partition("=")[2]
    hint = ""
    if option:
        name = option.split(".")[0]
        owners = _ids_with_option(stages, name, cfg)
        if owners:
            position = "; stages are addressed by id, not position" if stage_id.isdigit() else ""
            hint = (f"{position}; '{name}' is an option of {', '.join(owners)}: did you mean "
                    f"{STAGES_KEY}.{owners[0]}.{option}{'=' + value if value else ''}?")
        else:
            hint = f"; no stage of this pipeline has an option '{name}'"
        if not stage_id.isdigit():
            hint += f" (to append a stage: +{STAGES_KEY}.{stage_id}.stage=NAME)"
    elif stage_id.isdigit() and int(stage_id) < len(ids):  # the old list syntax: stages by position
        hint = f"; stages are addressed by id, not position: {STAGES_KEY}.{ids[int(stage_id)]}=..."
    return (f"{STAGES_KEY}.{stage_id}: pipeline {cfg.pipeline.get('name')} has no stage '{stage_id}' "
            f"(stages: {', '.join(ids)}){hint}")


def _ids_with_option(stages: DictConfig, option: str, cfg: DictConfig) -> List[str]:
    """Ids of the pipeline's stages that take `option` under `cfg` (an error path only)."""
    from appliance.pipeline import STAGES
    from appliance.stages.build import load_stages

    try:
        load_stages(cfg.get("plugins") or [])
    except ConfigError:
        return []
    owners = []
    for stage_id, node in stages.items():
        name = str((node.get("stage") if isinstance(node, DictConfig) else None) or stage_id)
        cls = STAGES.get(name)
        if cls is not None and option in {f.name for f in fields(cls.options_for(cfg))}:
            owners.append(str(stage_id))
    return owners
