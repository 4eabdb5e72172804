"""Every override a message tells the user to set names a key that composes, and the common slips
(a stage option set at the root, a list split by the shell) are answered with the right spelling."""
import ast
import functools
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from appliance.config.compose import compose, group_options
from appliance.errors import ConfigError

PACKAGE = Path(__file__).resolve().parents[2] / "appliance"
# `key.sub=` inside a string: an override the message asks for (not `${x.y}`, a URL or a path).
OVERRIDE = re.compile(r"(?<![\w.${/-])((?:[a-z_]+\.)+[a-z_]+)=")


def _docstrings(tree: ast.AST) -> set:
    nodes = (n for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                                          ast.AsyncFunctionDef)))
    return {id(n.body[0].value) for n in nodes
            if n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def named_overrides():
    """(module, key) for every override named in a string of the package that is not a docstring."""
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                for match in OVERRIDE.finditer(node.value):
                    if not match.group(1).startswith("hydra."):  # our own search-path override
                        found.add((str(path.relative_to(PACKAGE.parent)), match.group(1)))
    return sorted(found)


@functools.lru_cache(maxsize=1)
def composed_configs():
    """Every pipeline, and every model under the pipeline its name belongs to, fully spelled out."""
    configs = [compose([f"pipeline={p}"]) for p in group_options("pipeline")]
    for model in group_options("model"):
        pipeline = "prithvi_flood" if model.startswith("prithvi") else "llava_chat"
        configs.append(compose([f"pipeline={pipeline}", f"model={model}"]))
    return tuple(configs)


def test_the_scan_finds_the_hints_it_is_meant_to_check():
    keys = {key for _, key in named_overrides()}
    assert {"pipeline.stages.raster_read.bands", "model.checkpoint", "engine.kv_cache_memory_bytes"} <= keys


@pytest.mark.parametrize("module, key", named_overrides())
def test_every_override_a_message_names_exists(module, key):
    missing = object()
    assert any(OmegaConf.select(cfg, key, default=missing) is not missing for cfg in composed_configs()), (
        f"{module} tells users to set {key}=..., which no composed config has")


@pytest.mark.parametrize("override, suggestion", [
    ("tile.overlap=64", "did you mean pipeline.stages.tile.overlap=64?"),
    ("+tile.overlap=64", "did you mean pipeline.stages.tile.overlap=64?"),
    ("raster_read.bands=[1,2,3,4,5,6]", "did you mean pipeline.stages.raster_read.bands=[1,2,3,4,5,6]?"),
])
def test_a_stage_option_at_the_root_gets_its_full_key(override, suggestion):
    with pytest.raises(ConfigError, match=re.escape(suggestion)):
        compose(["pipeline=prithvi_flood", override])


def test_an_engine_stage_option_under_the_engine_group_gets_its_full_key():
    with pytest.raises(ConfigError, match=re.escape("did you mean pipeline.stages.engine.sampling.max_tokens=9?")):
        compose(["pipeline=llava_chat", "engine.sampling.max_tokens=9"])


def test_the_suggested_stage_option_composes():
    cfg = compose(["pipeline=prithvi_flood", "pipeline.stages.tile.overlap=64"])
    assert cfg.pipeline.stages.tile.overlap == 64


def test_an_unknown_root_key_that_is_no_stage_gets_no_suggestion():
    with pytest.raises(ConfigError) as caught:
        compose(["pipeline=prithvi_flood", "overlap=64"])
    assert "did you mean" not in str(caught.value) and "allowed:" in str(caught.value)


@pytest.mark.parametrize("argv, word", [
    (["input=[a.tif,", "b.tif]"], "'input=[a.tif,'"),        # `input=[a.tif, b.tif]` unquoted
    (["prompt=hello", "world"], "'world'"),                   # `prompt=hello world` unquoted
])
def test_an_override_split_by_the_shell_says_to_quote_it(argv, word):
    with pytest.raises(ConfigError) as caught:
        compose(["pipeline=prithvi_flood", *argv])
    message = str(caught.value)
    assert word in message and "quote" in message and "'input=[a.tif, b.tif]'" in message


def test_the_quoted_forms_the_hint_gives_compose():
    cfg = compose(["pipeline=prithvi_flood", "input=[a.tif, b.tif]", "prompt=hello world"])
    assert list(cfg.input) == ["a.tif", "b.tif"] and cfg.prompt == "hello world"


@pytest.mark.parametrize("override, suggestion, composed", [
    ("input=a.tif,b.tif", "input=[a.tif,b.tif]", ["a.tif", "b.tif"]),
    ("aoi=1,2,3,4", "aoi=[1,2,3,4]", [1, 2, 3, 4]),
    ("model.name=a,b", "'model.name=\"a,b\"'", "a,b"),  # a text key: one text, quoted
])
def test_a_comma_separated_value_gets_a_form_that_composes(override, suggestion, composed):
    with pytest.raises(ConfigError) as caught:
        compose(["pipeline=prithvi_flood", override])
    assert suggestion in str(caught.value)
    assert "'input=\"" not in str(caught.value)  # the quoted form makes one path, not a list
    value = OmegaConf.select(compose(["pipeline=prithvi_flood", suggestion.strip("'")]), override.partition("=")[0])
    assert (OmegaConf.to_object(value) if OmegaConf.is_config(value) else value) == composed


def test_a_stage_addressed_by_position_gets_the_stage_that_has_the_option():
    with pytest.raises(ConfigError) as caught:
        compose(["pipeline=prithvi_flood", "pipeline.stages.3.overlap=64"])
    message = str(caught.value)
    assert "did you mean pipeline.stages.tile.overlap=64?" in message and "normalize.overlap" not in message
    with pytest.raises(ConfigError) as caught:
        compose(["pipeline=prithvi_flood", "pipeline.stages.3.nothing=1"])
    assert "no stage of this pipeline has an option 'nothing'" in str(caught.value)
    assert "did you mean" not in str(caught.value)
