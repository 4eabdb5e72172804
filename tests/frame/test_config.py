"""Config composition against the schemas, and every bad-override case, in-process."""
import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError

from appliance.config.compose import compose, group_options
from appliance.config.schema import DType, EngineKind
from appliance.errors import ConfigError
from tests.conftest import assert_config_error


@pytest.mark.parametrize("pipeline", group_options("pipeline"))
def test_every_pipeline_composes(pipeline):
    cfg = compose([f"pipeline={pipeline}"])
    assert cfg.pipeline.name == pipeline
    assert cfg.pipeline.stages, "a pipeline lists its stages"
    assert cfg.model.name and cfg.model.architecture


@pytest.mark.parametrize("model", group_options("model"))
def test_every_model_composes_under_its_pipeline(model):
    pipeline = "prithvi_flood" if model.startswith("prithvi") else "llava_chat"
    cfg = compose([f"pipeline={pipeline}", f"model={model}"])
    assert cfg.model.architecture


def test_a_model_without_the_pipelines_inputs_is_named():
    with pytest.raises(ConfigError, match="model.geo.means"):
        compose(["pipeline=prithvi_flood", "model=llava_1_5_7b"])


@pytest.mark.parametrize("engine", group_options("engine"))
def test_every_engine_composes(engine):
    cfg = compose([f"engine={engine}"])
    assert isinstance(cfg.engine.kind, EngineKind)


def test_pipeline_selects_its_model_and_engine_and_user_choice_wins():
    cfg = compose(["pipeline=llava_chat"])
    assert cfg.model.architecture == "LlavaForConditionalGeneration"
    assert cfg.engine.kind == EngineKind.generate
    cfg = compose(["pipeline=llava_chat", "model=llava_next_mistral_7b", "engine.dtype=bfloat16"])
    assert cfg.model.architecture == "LlavaNextForConditionalGeneration"
    assert cfg.engine.dtype == DType.bfloat16


def test_config_is_struct_and_typed():
    cfg = compose(["engine.block_size=32", "server.port=9000"])
    assert cfg.engine.block_size == 32 and cfg.server.port == 9000
    assert cfg.server.host == "127.0.0.1", "loopback by default"
    with pytest.raises(ConfigAttributeError):
        cfg.engine.not_a_field = 1
    assert OmegaConf.is_config(cfg)


@pytest.mark.parametrize(
    "override, fragments",
    [
        (["engine.block_sizee=3"], ["engine.block_sizee", "allowed:", "block_size"]),
        (["+model.foo=1"], ["model.foo", "unknown key", "architecture"]),
        (["+engine.foo.bar=1"], ["engine.foo", "unknown key"]),
        (["+server.limits.nope=1"], ["server.limits.nope", "max_image_pixels"]),
        (["bogus=1"], ["bogus", "root config"]),
        (["engine.block_size=abc"], ["engine.block_size", "Integer"]),
        (["engine.kind=train"], ["engine.kind", "generate, pool"]),
        (["engine.dtype=float8"], ["engine.dtype", "float32"]),
        (["pipeline=nope"], ["pipeline=nope", "prithvi_flood"]),
        (["model=nope"], ["model=nope", "available"]),
        (["engine=[a,b]"], ["engine", "expected the name"]),
        (["pipeline=[a"], ["bad override"]),
    ],
)
def test_bad_overrides_name_the_key(override, fragments):
    assert_config_error(override, *fragments)
