"""`appliance config`: the config a run uses, with where each value came from.

Stage options are printed as the stages run them (`Stage.resolve_options`: a tile size left unset is the
model's), keys left null that the run reads from the checkpoint with the checkpoint's values
(model_facts.py), and a value that is not its stage's or the schema's default ends its line with where it
came from:

  tile_size: 512  # model: model.geo.tile_size            a model fact the stage takes
  max_model_len: 4096  # model: model.path/config.json    a fact of the checkpoint
  overlap: 64  # derived: tile_size // 8                   the stage's rule, from its other options
  temperature: 0.0  # pipeline: llava_chat                 the pipeline's YAML sets it
  max_num_seqs: 7  # override                              the command line sets it

The marks are comments: `yaml.safe_load` of the text gives the values alone (`resolved_tree`).
"""
from typing import Any, Dict, List, Sequence, Tuple, cast

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from appliance.config.commented_yaml import Path, commented_yaml, leaves
from appliance.config.free_text import split_free_text
from appliance.config.model_facts import CHECKPOINT, checkpoint_facts
from appliance.config.schema import GROUP_SCHEMAS

HEADER = ("the config this run uses; a comment names where a value came from when it is not the default:\n"
          "model (a fact of the model), derived (a stage's rule), pipeline (its YAML), override (the command line)")


def config_yaml(cfg: DictConfig, overrides: Sequence[str]) -> str:
    """`cfg` (composed from `overrides`) with its derived values resolved, as commented YAML."""
    return commented_yaml(*_resolved(cfg, overrides), HEADER)


def resolved_tree(cfg: DictConfig) -> Dict[str, Any]:
    """`cfg` as plain values, as the run uses them: each stage node with the options its stage runs (every
    option spelled out), and the checkpoint's facts where `cfg` leaves them null."""
    return _resolved(cfg, ())[0]


def _resolved(cfg: DictConfig, overrides: Sequence[str]) -> Tuple[Dict[str, Any], Dict[Path, str]]:
    """(the resolved tree, {path: where its value came from} for the values that are not their defaults)."""
    from appliance.stages.build import StageNode, stage_nodes

    tree = cast(Dict[str, Any], OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
    named = _overridden(overrides)
    notes = {path: "override" for path in leaves(tree) if any(_names(key, value, path) for key, value in named)}
    for node in stage_nodes(cfg.pipeline.stages, cfg):
        where = ("pipeline", "stages", node.id)
        options = cast(Dict[str, Any], OmegaConf.to_container(OmegaConf.structured(node.cls.options_for(cfg)),
                                                               enum_to_str=True))
        default = leaves({"stage": node.id, **options})
        for path, value in leaves(node.normalized()).items():
            if path not in default or default[path] != value:
                notes.setdefault((*where, *path), f"pipeline: {cfg.pipeline.name}")
        resolved = node.cls.resolve_options(node.options, cfg)
        tree["pipeline"]["stages"][node.id] = StageNode(node.id, node.cls, resolved.options).normalized()
        notes.update({(*where, option): f"model: {key}" for option, key in resolved.from_model.items()})
        notes.update({(*where, option): f"derived: {rule}" for option, rule in resolved.derived.items()})
    for fact, value in checkpoint_facts(cfg).items():
        _at(tree, fact[:-1])[fact[-1]] = value
        notes[fact] = f"model: {CHECKPOINT}"
    return tree, notes


def _at(tree: Dict[str, Any], path: Sequence[str]) -> Dict[str, Any]:
    for part in path:
        tree = tree[part]
    return tree


def _overridden(overrides: Sequence[str]) -> List[Tuple[Path, Any]]:
    """(key path, value) of each override that sets a value (a group choice such as `model=NAME` picks a
    file instead, and `~key` restores the default)."""
    lines, texts = split_free_text(overrides)
    named: List[Tuple[Path, Any]] = [((key,), text) for key, text in texts.items()]
    for override in OverridesParser.create().parse_overrides(lines):
        key = override.key_or_group
        if override.package is None and not override.is_delete() and key not in GROUP_SCHEMAS:
            named.append((tuple(key.split(".")), override.value()))
    return named


def _names(key: Path, value: Any, path: Path) -> bool:
    """Whether the override of `key` to `value` sets the value at `path`: `path` is `key`, or lies inside
    the mapping `value` sets there."""
    if path[:len(key)] != key:
        return False
    for part in path[len(key):]:
        if not isinstance(value, dict) or part not in value:
            return False
        value = value[part]
    return True
