"""Compose the config tree from `conf/` plus command-line overrides, and validate it strictly.

`$APPLIANCE_EXTRA_CONF_DIR` adds group files (`pipeline/x.yaml`, `model/y.yaml`, ...) to the tree without
touching it: the Helm chart mounts its `extraConfig` there, so a new pipeline or model needs no new image.

We use Hydra's compose API instead of `@hydra.main`: it never creates `outputs/` nor changes the
working directory, which matters in containers with read-only root file systems.
"""
import dataclasses
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from appliance.config.engine_check import check_engine
from appliance.field_rules import check_fields, nested_schema
from appliance.config.free_text import apply_free_text, split_free_text
from appliance.config.schema import GROUP_SCHEMAS, AppConfig, register_schemas
from appliance.config.stage_overrides import STAGES_KEY, apply_stage_overrides, override_text, split_stage_overrides
from appliance.errors import ConfigError

PACKAGE_DIR = Path(__file__).resolve().parents[1]
EXTRA_CONF_ENV = "APPLIANCE_EXTRA_CONF_DIR"


def conf_dir() -> Path:
    """The config tree: $APPLIANCE_CONF_DIR, else `conf/` beside the package (repo checkout)."""
    return Path(os.environ.get("APPLIANCE_CONF_DIR", PACKAGE_DIR.parent / "conf")).resolve()


def extra_conf_dir() -> Optional[Path]:
    """More group files beside conf/'s: $APPLIANCE_EXTRA_CONF_DIR, or None when unset."""
    value = os.environ.get(EXTRA_CONF_ENV)
    return Path(value).resolve() if value else None


def _check_extra_conf_dir(extra: Path) -> None:
    """The extra directory exists and adds names: a file there named like one in conf/ would lose to it."""
    if not extra.is_dir():
        raise ConfigError(f"${EXTRA_CONF_ENV}={extra}: no such directory")
    for group in GROUP_SCHEMAS:
        for path in sorted((extra / group).glob("*.yaml")):
            if (conf_dir() / group / path.name).exists():
                raise ConfigError(f"{group}/{path.name} in ${EXTRA_CONF_ENV} ({extra}) has the name of a file in "
                                  f"{conf_dir()}; give it another name")


def _asset(relative: str) -> str:
    """`${asset:models/x}`: absolute path of a file shipped in `appliance/assets/`."""
    return str(PACKAGE_DIR / "assets" / relative)


def _register_resolvers() -> None:
    if not OmegaConf.has_resolver("asset"):
        OmegaConf.register_new_resolver("asset", _asset)


def group_options(group: str) -> List[str]:
    dirs = [conf_dir(), extra_conf_dir()]
    return sorted({p.stem for d in dirs if d is not None for p in (d / group).glob("*.yaml")})


def _parse(overrides: Sequence[str]) -> List[Override]:
    parser = OverridesParser.create()
    parsed = []
    for line in overrides:  # one at a time, so the error can name the word at fault
        try:
            parsed.extend(parser.parse_overrides([line]))
        except HydraException as e:
            raise ConfigError(f"bad override {line!r}: {_first_line(e)}{_split_word_hint(line)}") from None
    for override in parsed:
        if override.is_sweep_override():  # `input=a.tif,b.tif`: Hydra reads a sweep over two values
            raise ConfigError(_sweep_hint(override_text(override)))
    return parsed


def _sweep_hint(line: str) -> str:
    """How to write what a comma-separated value usually means: a list, or (for a text key) one text."""
    key, _, value = line.partition("=")
    if _expects_text(key.lstrip("+~")):
        form = f"quote a text that holds commas, for Hydra and the shell: '{key}=\"{value}\"'"
    else:
        form = f"write a list in brackets: {key}=[{value}]"
    return f"{line}: one value per override, and a comma outside brackets separates the values of a sweep; {form}"


def _expects_text(key: str) -> bool:
    """Whether the schema types `key` as a text (str or Optional[str]); False when it does not know it."""
    schema: Any = AppConfig
    for part in key.split("."):
        annotation = {f.name: f.type for f in dataclasses.fields(schema)}.get(part) if schema else None
        if annotation is None:
            return False
        schema = nested_schema(annotation)
    return annotation is str or annotation == Optional[str]


def _split_word_hint(line: str) -> str:
    """The usual cause of a parse error: the shell split one override at a space (`input=[a.tif, b.tif]`
    arrives as `input=[a.tif,` and `b.tif]`; `prompt=hello world` as `prompt=hello` and `world`)."""
    unbalanced = any(line.count(a) != line.count(b) for a, b in ("[]", "{}", "()")) or line.count('"') % 2
    if "=" in line and not unbalanced:
        return ""
    return ("; the shell splits words at spaces: write a list without spaces (input=[a.tif,b.tif]) or quote "
            "the whole override ('input=[a.tif, b.tif]', 'prompt=hello world')")


def _check_group_choices(parsed: Sequence[Override]) -> None:
    """Name the available options when `group=choice` picks one that does not exist."""
    for override in parsed:
        key = override.key_or_group
        if key in GROUP_SCHEMAS and not override.is_delete():
            value = override.value()
            if not isinstance(value, str):
                raise ConfigError(f"{key}: expected the name of a config in conf/{key}/, got {value!r}")
            options = group_options(key)
            if value not in options:
                raise ConfigError(f"{key}={value}: no such {key} (available: {', '.join(options)})")


def compose(overrides: Sequence[str] = ()) -> DictConfig:
    """Return the composed, validated, resolved config for `overrides` (Hydra syntax, except the free-text
    keys such as `prompt=`, whose text is taken verbatim: free_text.py)."""
    register_schemas()
    _register_resolvers()
    extra = extra_conf_dir()
    if extra is not None:
        _check_extra_conf_dir(extra)
    overrides, texts = split_free_text(overrides)
    parsed = _parse(overrides)
    _check_group_choices(parsed)
    _check_stage_ids_at_root(parsed)
    hydra_overrides, stage_overrides = split_stage_overrides(parsed)
    # Hydra's search path after conf/: the extra directory's group files join conf/'s groups.
    search = [f"hydra.searchpath=['file://{_quoted(str(extra))}']"] if extra is not None else []
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            cfg = hydra_compose(config_name="config", overrides=[*search, *hydra_overrides])
        apply_stage_overrides(cfg, stage_overrides)  # options the YAML need not mention (stage_overrides.py)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(_describe(e)) from None
    checked = validate(cfg)
    apply_free_text(checked, texts)
    return checked


def _check_stage_ids_at_root(parsed: Sequence[Override]) -> None:
    """`tile.overlap=64` names a stage where a root key belongs, `engine.sampling.max_tokens=9` a stage option
    under the engine group: point at `pipeline.stages.<id>.<option>`."""
    strays = [o for o in parsed if o.package is None and not _in_schema(o.key_or_group)]
    if not strays:
        return
    stage_options = _stage_options([override_text(o) for o in parsed if o.key_or_group in GROUP_SCHEMAS])
    for override in strays:
        root, _, rest = override.key_or_group.partition(".")
        if root not in stage_options:
            continue
        if _in_schema(root) and rest.split(".")[0] not in stage_options[root]:
            continue  # a misspelt key of the group: the schema's own error lists its fields
        value = override_text(override).partition("=")[2]
        suggestion = f"{STAGES_KEY}.{override.key_or_group}" + (f"={value}" if value else "")
        where = f"group '{root}'" if _in_schema(root) else "the root config"
        raise ConfigError(f"{override.key_or_group}: unknown key in {where}; '{root}' is a stage of this "
                          f"pipeline: did you mean {suggestion}?")


def _in_schema(key: str) -> bool:
    """Whether `key`'s first two parts are fields of the schema (a root key, or a field of its group)."""
    parts = key.split(".")[:2]
    return all(part in _fields_beside(".".join(parts[:i + 1])) for i, part in enumerate(parts))


def _stage_options(group_choices: Sequence[str]) -> Dict[str, List[str]]:
    """{stage id: its option names} of the pipeline these group choices compose (an error path only)."""
    from appliance.stages.build import load_stages, stage_nodes

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            cfg = hydra_compose(config_name="config", overrides=list(group_choices))
        load_stages(cfg.plugins)
        return {node.id: [f.name for f in dataclasses.fields(node.options)]
                for node in stage_nodes(cfg.pipeline.stages, cfg)}
    except (HydraException, OmegaConfBaseException, ConfigError):
        return {}


def validate(cfg: DictConfig) -> DictConfig:
    """Re-merge into the schema in struct mode (rejects keys added with `+group.key=value` too), check
    every field's declared rule (field_rules.py) and the engine settings against model and host, then
    build every stage from its node: each stage's options are checked against its `Options` dataclass
    and by the stage itself before anything runs (the stage graph is `build_pipeline`'s to check). The
    stage nodes come back with every option spelled out."""
    from appliance.stages.build import build_stages, load_stages, stage_nodes

    try:
        container = OmegaConf.to_container(cfg, resolve=True)
        checked = OmegaConf.merge(OmegaConf.structured(AppConfig), container)
        OmegaConf.set_struct(checked, True)
        # Surface missing mandatory values (???) now rather than deep inside a stage.
        OmegaConf.to_container(checked, throw_on_missing=True)
    except OmegaConfBaseException as e:
        raise ConfigError(_describe(e)) from None
    if not isinstance(checked, DictConfig):  # merged into the AppConfig schema: always a mapping
        raise ConfigError(f"the configuration is a {type(checked).__name__}, not a mapping of groups")
    check_fields(checked, AppConfig)  # each setting's declared rule (server.*, engine.*), before any model
    check_engine(checked)  # settings that can never run (e.g. a block size xformers' kernels refuse)
    load_stages(checked.plugins)
    checked.pipeline.stages = {node.id: node.normalized() for node in stage_nodes(checked.pipeline.stages, checked)}
    build_stages(checked)  # loads no weights: the stages' own checks of their options
    return checked


def _describe(error: BaseException) -> str:
    """One line naming the key and what is allowed, from the innermost OmegaConf error."""
    e = _keyed_cause(error)
    key = getattr(e, "full_key", None)
    message = _first_line(e)
    if not key:
        return message
    if "not in" in message and message.startswith("Key '"):
        allowed = _fields_beside(key)
        where = f"group '{key.split('.')[0]}'" if "." in key else "the root config"
        return f"{key}: unknown key in {where}" + (f" (allowed: {', '.join(allowed)})" if allowed else "")
    if "Missing mandatory value" in message:
        return f"{key}: missing a value (set it in conf/ or as {key}=...)"
    return f"{key}: {message}"


def _keyed_cause(error: BaseException) -> BaseException:
    seen: Optional[BaseException] = error
    while seen is not None:
        if getattr(seen, "full_key", None):
            return seen
        seen = seen.__cause__ or seen.__context__
    return error


def _fields_beside(full_key: str) -> List[str]:
    """Field names allowed next to `full_key`, read from the schema dataclasses."""
    schema: Any = AppConfig  # a schema dataclass, or None below a field that is not one
    for part in full_key.split(".")[:-1]:
        field_types = {f.name: f.type for f in dataclasses.fields(schema)}
        schema = nested_schema(field_types.get(part))
        if schema is None:
            return []
    return [f.name for f in dataclasses.fields(schema)]


def _quoted(text: str) -> str:
    """`text` inside a single-quoted Hydra string (Hydra keeps backslashes not followed by a quote)."""
    return text.replace("'", "\\'")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # OmegaConf appends "full_key: ... object_type=..." lines; the first line carries the message.
    return lines[0] if lines else type(e).__name__
