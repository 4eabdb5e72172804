"""No YAML under conf/ sets a key to the value its schema already gives it: a restated default would
silently keep the old value when the schema's default changes (STYLE.md: YAML holds only what differs)."""
import dataclasses
import enum
from pathlib import Path
from typing import Any, Iterator, List, Tuple

import pytest
from omegaconf import MISSING, OmegaConf

from appliance.config.compose import conf_dir
from appliance.field_rules import nested_schema
from appliance.config.schema import GROUP_SCHEMAS, AppConfig, ServerLimits
from appliance.pipeline import STAGES
from appliance.stages.build import load_stages

NO_DEFAULT = object()
# A checkpoint's own facts (its architecture, its input contract, its multimodal layout) are stated in full in
# its model file: there a schema default is a guess at some checkpoint, and changing it must not change a model.
CHECKPOINT_FACTS = ("model.prithvi", "model.geo", "model.vision_language")


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return NO_DEFAULT
    if value is MISSING:
        return NO_DEFAULT
    if dataclasses.is_dataclass(value):
        return OmegaConf.to_container(OmegaConf.structured(value), enum_to_str=True)
    return value.value if isinstance(value, enum.Enum) else value


def restated(node: Any, schema: type, where: str) -> Iterator[Tuple[str, Any]]:
    """(key path, value) of every key under `node` whose value equals `schema`'s default for it."""
    by_name = {f.name: f for f in dataclasses.fields(schema)}
    for key, value in node.items():
        path = f"{where}.{key}" if where else str(key)
        field = by_name.get(key)
        if field is None:
            continue  # an unknown key is compose's error to report, not this test's
        if path == "pipeline.stages":
            yield from _restated_stage_options(value)
            continue
        if path in CHECKPOINT_FACTS:
            continue
        nested = nested_schema(field.type)
        if nested is not None and isinstance(value, dict):
            yield from restated(value, nested, path)
        elif _default(field) is not NO_DEFAULT and value == _default(field):
            yield path, value


def _restated_stage_options(stages: Any) -> Iterator[Tuple[str, Any]]:
    for stage_id, node in (stages or {}).items():
        node = dict(node or {})
        cls = STAGES.get(node.pop("stage", None) or stage_id)
        if cls is not None:
            yield from restated(node, cls.Options, f"pipeline.stages.{stage_id}")


def _package(path: Path) -> str:
    """Where a group file's keys land: `# @package` if the file says, else its group path (model/geo -> model.geo)."""
    first = path.read_text().splitlines()[0] if path.read_text() else ""
    if first.startswith("# @package"):
        package = first.split(None, 2)[2].strip()
        return "" if package == "_global_" else package
    return ".".join(path.parent.relative_to(conf_dir()).parts)


def _nest(package: str, node: dict) -> dict:
    for part in reversed(package.split(".") if package else []):
        node = {part: node}
    return node


def group_files() -> List[Path]:
    return sorted(p for group in GROUP_SCHEMAS for p in (conf_dir() / group).rglob("*.yaml"))


def restated_in(path: Path) -> List[Tuple[str, Any]]:
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    raw.pop("defaults", None)
    return list(restated(_nest(_package(path), raw), AppConfig, ""))


@pytest.fixture(scope="module", autouse=True)
def _stages():
    load_stages([])


@pytest.mark.parametrize("path", group_files(), ids=lambda p: str(p.relative_to(conf_dir())))
def test_no_yaml_restates_a_schema_default(path):
    found = restated_in(path)
    assert not found, (f"{path.relative_to(conf_dir())} sets keys to their schema defaults (delete them; the "
                       f"schema is the one place a default lives): " + ", ".join(f"{k}={v!r}" for k, v in found))


def test_the_walk_finds_restated_defaults_at_every_depth(tmp_path, monkeypatch):
    """The check can fail: a group key, a nested dataclass's key and a stage option, each restated; a
    checkpoint's facts may be stated."""
    monkeypatch.setenv("APPLIANCE_CONF_DIR", str(tmp_path))
    pixels = ServerLimits().max_image_pixels
    files = {
        "server/x.yaml": f"host: 127.0.0.1\nport: 9000\nlimits:\n  max_image_pixels: {pixels}\n",
        "engine/x.yaml": "kind: generate\nmax_batch_size: 4\n",
        "model/x.yaml": "checkpoint: null\nprithvi:\n  patch_size: 16\n",
        "pipeline/x.yaml": ("# @package _global_\ndefaults:\n  - override /engine: pool\n"
                            "pipeline:\n  name: x\n  stages:\n    tile: {overlap: null}\n    raster_write: {}\n"
                            "server:\n  ui: true\n"),
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = {name: restated_in(tmp_path / name) for name in files}
    assert found == {
        "server/x.yaml": [("server.host", "127.0.0.1"), ("server.limits.max_image_pixels", pixels)],
        "engine/x.yaml": [("engine.kind", "generate")],
        "model/x.yaml": [("model.checkpoint", None)],
        "pipeline/x.yaml": [("pipeline.stages.tile.overlap", None), ("server.ui", True)],
    }
