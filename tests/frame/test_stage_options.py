"""Stages addressed by id, their options checked against each stage's `Options` when the config is
composed, defaults in the dataclasses, one shared geo contract; in-process, on the shipped conf/."""
import dataclasses
import inspect
import re
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from appliance.config.compose import compose, conf_dir, group_options
from appliance.config.schema import GeoModelConfig
from appliance.errors import ConfigError
from appliance.pipeline import STAGES, NoOptions
from appliance.stages.build import load_stages
from appliance.stages.engine_stage import sampling_defaults
from tests.conftest import assert_config_error

FLOOD = ["pipeline=prithvi_flood"]
CHAT = ["pipeline=llava_chat"]


@pytest.mark.parametrize("overrides, key, value", [
    (FLOOD + ["pipeline.stages.tile.overlap=64"], "tile.overlap", 64),  # not in the YAML, no `+`
    (FLOOD + ["pipeline.stages.raster_write.quicklook=true"], "raster_write.quicklook", True),
    (FLOOD + ["+pipeline.stages.tile.overlap=3"], "tile.overlap", 3),  # `+` is accepted too
    (FLOOD + ["pipeline.stages.tile={tile_size: 256, overlap: 0}"], "tile.tile_size", 256),
    (FLOOD + ["pipeline.stages.stitch.blending=linear"], "stitch.blending", "linear"),
    (FLOOD + ["pipeline.stages.normalize.means=[1,2,3,4,5,6]"], "normalize.means", [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
    (FLOOD + ["pipeline.stages.tile.tile_size=${engine.max_batch_size}"], "tile.tile_size", 8),
    (FLOOD, "tile.padding", "reflect"),  # the dataclass default, though the YAML says `tile: {}`
    (FLOOD, "tile.stage", "tile"),  # the node names its stage once composed
    (CHAT + ["pipeline.stages.engine.sampling.max_tokens=4"], "engine.sampling.max_tokens", 4),
    (CHAT + ["pipeline.stages.chat_prompt.workers=3"], "chat_prompt.workers", 3),
])
def test_stage_options_are_set_by_id(overrides, key, value):
    cfg = compose(overrides)
    got = OmegaConf.select(cfg.pipeline.stages, key)
    assert (OmegaConf.to_container(got) if OmegaConf.is_config(got) else got) == value


def test_engine_sampling_override_keeps_the_pipelines_other_defaults():
    defaults = sampling_defaults(compose(CHAT + ["pipeline.stages.engine.sampling.max_tokens=4"]))
    assert defaults == {"temperature": 0.0, "max_tokens": 4}


def test_stages_keep_their_order_and_can_be_appended_or_dropped():
    cfg = compose(FLOOD + ["+pipeline.stages.again={stage: raster_write, quicklook: true}"])
    assert list(cfg.pipeline.stages)[-2:] == ["region", "again"]
    assert cfg.pipeline.stages.again.stage == "raster_write" and cfg.pipeline.stages.again.quicklook
    cfg = compose(CHAT + ["~pipeline.stages.chat_responses"])
    assert list(cfg.pipeline.stages) == ["chat_requests", "chat_prompt", "engine"]
    cfg = compose(CHAT + ["~pipeline.stages.engine.sampling"])
    assert sampling_defaults(cfg) == {}  # back to the dataclass default


@pytest.mark.parametrize("overrides, fragments", [
    (FLOOD + ["pipeline.stages.tile.overlapp=64"],
     ["pipeline.stages.tile.overlapp", "unknown option for stage 'tile'",
      "allowed: tile_size, stride, overlap, padding"]),
    (FLOOD + ["pipeline.stages.tile.overlap=big"], ["pipeline.stages.tile.overlap", "Integer", "stage 'tile'"]),
    (FLOOD + ["pipeline.stages.stitch.blending=gaussian"],
     ["pipeline.stages.stitch.blending", "cosine, linear, none", "stage 'stitch'"]),
    (FLOOD + ["pipeline.stages.tilee.overlap=64"],
     ["pipeline.stages.tilee", "no stage 'tilee'", "stages: raster_inputs, raster_read, tile", "+pipeline.stages"]),
    (FLOOD + ["pipeline.stages.6.quicklook=true"],
     ["pipeline.stages.6", "addressed by id", "pipeline.stages.raster_write.quicklook="]),
    (FLOOD + ["pipeline.stages.tile.stage=nope"], ["pipeline.stages.tile.stage", "unknown stage 'nope'", "stitch"]),
    (FLOOD + ["pipeline.stages.tile=5"], ["pipeline.stages.tile", "expected a mapping"]),
    (FLOOD + ["pipeline.stages.tile.overlap=1,2"], ["pipeline.stages.tile.overlap=1,2", "one value"]),
    (FLOOD + ["~pipeline.stages.tile.overlap"], ["does not set pipeline.stages.tile.overlap"]),
    (FLOOD + ["pipeline.stages.tile.stride=48", "pipeline.stages.tile.overlap=8"], ["tile", "disagree"]),
    (FLOOD + ["pipeline.stages.raster_write.block_size=100"], ["raster_write.block_size", "multiple of 16"]),
    (CHAT + ["pipeline.stages.engine.sampling=3"], ["pipeline.stages.engine.sampling"]),
    (CHAT + ["pipeline.stages.chat_prompt.content_format=html"],
     ["pipeline.stages.chat_prompt.content_format", "auto, parts"]),
    (CHAT + ["pipeline.stages.engine.sampling.max_tokns=3"],
     ["pipeline.stages.engine.sampling.max_tokns", "allowed: temperature"]),
    (CHAT + ["pipeline.stages.engine.sampling.max_tokens=abc"],
     ["pipeline.stages.engine.sampling.max_tokens", "Integer"]),
    (CHAT + ["pipeline.stages.engine.sampling.temperature=-1"],
     ["pipeline.stages.engine.sampling", "temperature must be >= 0"]),
    (FLOOD + ["pipeline.stages.tile.stride=1000"], ["pipeline.stages.tile.stride", "1..tile_size=512"]),
    (FLOOD + ["pipeline.stages.stitch.progress_interval=0"],
     ["pipeline.stages.stitch.progress_interval", "a number of seconds above 0"]),
    (CHAT + ["pipeline.stages.engine.progress_interval=-5"],
     ["pipeline.stages.engine.progress_interval", "a number of seconds above 0"]),
])
def test_bad_stage_options_are_refused_at_compose_time(overrides, fragments):
    assert_config_error(overrides, *fragments)


def _raw_pipeline(name):
    return yaml.safe_load((conf_dir() / "pipeline" / f"{name}.yaml").read_text())["pipeline"]


@pytest.mark.parametrize("pipeline", group_options("pipeline"))
def test_pipeline_yaml_states_only_what_differs_from_the_stage_defaults(pipeline):
    load_stages([])
    for stage_id, node in (_raw_pipeline(pipeline)["stages"] or {}).items():
        node = dict(node or {})
        options = STAGES[node.pop("stage", stage_id)].Options()
        for key, value in node.items():
            assert getattr(options, key) != value, f"{pipeline}: {stage_id}.{key} repeats its default {value!r}"


def test_every_built_in_stage_declares_options_one_way():
    """`<Stage>Options` at module level in the stage's module (or no options at all)."""
    load_stages([])
    for name, cls in STAGES.items():
        if not cls.__module__.startswith("appliance."):
            continue  # stages of test plugins
        if cls.Options is NoOptions:
            continue
        assert dataclasses.is_dataclass(cls.Options), name
        assert cls.Options.__module__ == cls.__module__, f"{name}: Options declared in {cls.Options.__module__}"
        assert "." not in cls.Options.__qualname__, f"{name}: Options nested in the class"
        assert cls.Options.__name__ == f"{cls.__name__}Options", name
        module = inspect.getmodule(cls)
        assert getattr(module, cls.Options.__name__) is cls.Options


@pytest.mark.parametrize("model", group_options("model"))
def test_every_model_file_starts_from_the_schema(model):
    defaults = yaml.safe_load((conf_dir() / "model" / f"{model}.yaml").read_text()).get("defaults") or []
    assert defaults and defaults[0] == "schema", f"conf/model/{model}.yaml: defaults: [schema, ...]"


@pytest.mark.parametrize("task, contract, count", [("flood", "sen1floods11", 6), ("burn_scars", "hls_burn_scars", 3),
                                                  ("crops", "hls_crops", 3)])
def test_prithvi_models_share_one_geo_contract_per_task(task, contract, count):
    """Bands, scale, classes and colours come from the task's contract; a model file may state only what
    its fine-tune saw differently: its normalisation (Prithvi-100M-sen1floods11's means and stds) and its
    tile size (the Prithvi-EO-1.0 fine-tunes' 224)."""
    own = yaml.safe_load((conf_dir() / "model" / "geo" / f"{contract}.yaml").read_text())
    shared = OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(GeoModelConfig), own))  # with defaults
    prithvi = [m for m in group_options("model") if m.startswith("prithvi") and m.endswith(task)]
    assert len(prithvi) == count
    for model in prithvi:
        stated = yaml.safe_load((conf_dir() / "model" / f"{model}.yaml").read_text()).get("geo") or {}
        assert set(stated) <= {"means", "stds", "tile_size"}, model
        geo = OmegaConf.to_container(compose([f"pipeline=prithvi_{task}", f"model={model}"]).model.geo)
        assert geo == {**shared, **stated}, model


def test_geo_stage_options_default_to_the_models_contract():
    """`normalize` and `raster_read` options left unset take model.geo; set, they win."""
    from appliance.stages.build import build_pipeline

    pipeline = build_pipeline(compose(FLOOD + ["pipeline.stages.normalize.means=[0,0,0,0,0,0]"]))
    normalize = next(s for s in pipeline.stages if s.id == "normalize")
    assert normalize.means.ravel().tolist() == [0.0] * 6
    assert normalize.stds.ravel().tolist() == pytest.approx(list(compose(FLOOD).model.geo.stds))


def test_the_tile_size_is_the_models_unless_the_pipeline_sets_one():
    from appliance.stages.build import build_pipeline

    def tile_stage(overrides):
        return next(s for s in build_pipeline(compose(overrides)).stages if s.name == "tile")

    assert tile_stage(FLOOD).tile_size == 512
    eo1 = FLOOD + ["model=prithvi_eo1_100m_flood", "model.checkpoint=/unused.pt"]
    assert tile_stage(eo1).tile_size == 224 and tile_stage(eo1).stride == 224 - 224 // 8
    assert tile_stage(eo1 + ["pipeline.stages.tile.tile_size=300"]).tile_size == 300


def test_stage_ids_reach_the_built_stages():
    from appliance.stages.build import build_pipeline

    pipeline = build_pipeline(compose(FLOOD + ["+pipeline.stages.again={stage: raster_write}"]))
    assert [s.id for s in pipeline.stages][-3:] == ["raster_write", "region", "again"]
    assert [s.name for s in pipeline.stages][-3:] == ["raster_write", "region", "raster_write"]
    assert len({id(s.shared) for s in pipeline.stages}) == 1, "one Shared per pipeline"


def test_conf_tree_has_no_list_of_stages():
    for path in Path(conf_dir(), "pipeline").glob("*.yaml"):
        assert isinstance(yaml.safe_load(path.read_text())["pipeline"]["stages"], dict), path


@pytest.mark.parametrize("pipeline, keys", [
    ("llava_chat", ["stage", "sampling", "progress", "progress_interval"]),  # generating: no input/output
    ("prithvi_flood", ["stage", "input", "output"]),  # a pooling engine: no sampling
    ("llava_encode", ["stage", "input", "output"]),
])
def test_the_engine_stage_shows_only_the_options_of_its_kind(pipeline, keys):
    assert list(compose([f"pipeline={pipeline}"]).pipeline.stages.engine) == keys


def test_an_option_of_the_other_engine_kind_is_refused_naming_the_kind():
    refusal = ("pipeline.stages.engine.sampling: does not apply to stage 'engine' with engine.kind=pool "
               "(its options there: input, output)")
    with pytest.raises(ConfigError, match=re.escape(refusal)):
        compose(["pipeline=prithvi_flood", "pipeline.stages.engine.sampling.max_tokens=3"])
    with pytest.raises(ConfigError, match=re.escape("pipeline.stages.engine.input: does not apply")):
        compose(["pipeline=llava_chat", "pipeline.stages.engine.input=x"])
    # each kind's own options still work
    assert compose(["pipeline=llava_chat", "pipeline.stages.engine.sampling.max_tokens=3"]
                   ).pipeline.stages.engine.sampling.max_tokens == 3
    assert compose(["pipeline=llava_encode", "pipeline.stages.engine.output=f"]).pipeline.stages.engine.output == "f"
