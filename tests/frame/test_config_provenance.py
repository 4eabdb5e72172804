"""`appliance config` prints the values a run uses (stage options resolved as the stages resolve them),
each not-default value marked with where it came from, as YAML that reads back to those values."""
import json
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from appliance.cli import main
from appliance.config.commented_yaml import commented_yaml
from appliance.config.compose import compose, group_options
from appliance.config.model_facts import checkpoint_facts
from appliance.config.provenance import resolved_tree
from appliance.stages.build import build_pipeline

FLOOD = ["pipeline=prithvi_flood"]
EO1 = FLOOD + ["model=prithvi_eo1_100m_flood", "model.checkpoint=/unused.pt"]
# Options whose None is decided per input file (its band descriptions, scale tags, nodata), or per
# output (overviews by what the file holds): the config alone cannot give their values.
DECIDED_BY_THE_FILES = {("raster_read", "bands"), ("raster_read", "scale"), ("raster_read", "nodata"),
                        ("raster_read", "resample"), ("raster_write", "overview_resampling")}


def printed(capsys, overrides):
    """(the text `appliance config` prints, its lines by stripped content)."""
    assert main(["config", *overrides]) == 0
    text = capsys.readouterr().out
    return text, [line.strip() for line in text.splitlines()]


def at(tree, path):
    for part in path:
        tree = tree[part]
    return tree


def built_stage(overrides, name):
    return next(s for s in build_pipeline(compose(overrides)).stages if s.name == name)


@pytest.mark.parametrize("overrides, size", [(FLOOD, 512), (EO1, 224)])
def test_the_tile_stage_prints_the_size_and_stride_the_run_tiles_with(capsys, overrides, size):
    text, lines = printed(capsys, overrides)
    tile = yaml.safe_load(text)["pipeline"]["stages"]["tile"]
    assert (tile["tile_size"], tile["overlap"], tile["stride"]) == (size, size // 8, size - size // 8)
    stage = built_stage(overrides, "tile")
    assert (stage.tile_size, stage.stride) == (tile["tile_size"], tile["stride"])
    assert f"tile_size: {size}  # model: model.geo.tile_size" in lines
    assert f"overlap: {size // 8}  # derived: tile_size // 8" in lines
    assert f"stride: {size - size // 8}  # derived: tile_size - overlap" in lines
    assert "padding: reflect" in lines, "a stage default carries no mark"


def test_an_override_is_marked_and_the_options_it_leaves_are_derived_from_it(capsys):
    _, lines = printed(capsys, FLOOD + ["pipeline.stages.tile.overlap=64", "engine.max_num_seqs=7"])
    assert "overlap: 64  # override" in lines
    assert "stride: 448  # derived: tile_size - overlap" in lines
    assert "tile_size: 512  # model: model.geo.tile_size" in lines
    assert "max_num_seqs: 7  # override" in lines
    _, lines = printed(capsys, FLOOD + ["pipeline.stages.tile={tile_size: 256, stride: 200}"])
    assert "tile_size: 256  # override" in lines and "stride: 200  # override" in lines
    assert "overlap: 56  # derived: tile_size - stride" in lines
    assert "padding: reflect" in lines, "the mapping given does not set it"


def test_model_facts_taken_by_the_stages_are_marked_and_an_override_of_the_fact_reaches_them(capsys):
    text, lines = printed(capsys, FLOOD + ["model.geo.tile_size=256"])
    assert "tile_size: 256  # override" in lines and "tile_size: 256  # model: model.geo.tile_size" in lines
    stages = yaml.safe_load(text)["pipeline"]["stages"]
    geo = compose(FLOOD).model.geo
    assert stages["normalize"] == {"stage": "normalize", "means": list(geo.means), "stds": list(geo.stds)}
    assert stages["raster_write"]["class_names"] == list(geo.class_names)
    assert "class_names: [land, water]  # model: model.geo.class_names" in lines


def test_the_pipelines_own_settings_are_marked_with_its_name(capsys):
    _, lines = printed(capsys, ["pipeline=llava_chat", "pipeline.stages.engine.sampling.max_tokens=9"])
    assert "temperature: 0.0  # pipeline: llava_chat" in lines
    assert "max_tokens: 9  # override" in lines
    assert "workers: 2" in lines, "a stage default carries no mark"


@pytest.mark.parametrize("pipeline", group_options("pipeline"))
def test_no_stage_option_prints_null_where_the_config_gives_its_value(capsys, pipeline):
    text, _ = printed(capsys, [f"pipeline={pipeline}"])
    stages = yaml.safe_load(text)["pipeline"]["stages"]
    nulls = {(node, option) for node, options in stages.items() for option, value in options.items() if value is None}
    assert nulls <= DECIDED_BY_THE_FILES, nulls - DECIDED_BY_THE_FILES


@pytest.mark.parametrize("overrides", [
    *([f"pipeline={name}"] for name in group_options("pipeline")),
    ["pipeline=llava_chat", "prompt=What's ${x}? 'a, b' # not a comment", "system=line one\nline two",
     "pipeline.stages.engine.sampling.stop=['\n\n']", "server.api_key=null"],
    FLOOD + ["pipeline.stages.tile.stride=300", "aoi=[-91.2,29.9,-90.9,30.2]", "output=masks/"],
])
def test_the_printed_yaml_reads_back_to_the_values_the_run_uses(capsys, overrides):
    text, _ = printed(capsys, overrides)
    cfg = compose(overrides)
    tree = resolved_tree(cfg)
    assert yaml.safe_load(text) == tree
    composed = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    stages = composed["pipeline"].pop("stages")
    printed_stages = tree["pipeline"].pop("stages")
    for (*parents, key) in checkpoint_facts(cfg):
        assert key in at(composed, parents) and at(composed, parents)[key] is None
        del at(composed, parents)[key], at(tree, parents)[key]
    assert tree == composed, "only stage options and the checkpoint's facts are resolved"
    for node, options in stages.items():
        for option, value in options.items():
            if value is not None:
                assert printed_stages[node][option] == value, (node, option)


def test_printed_stage_options_compose_back_to_the_same_stage(capsys):
    """The output is a starting point for a config of one's own: its resolved options are accepted as given."""
    text, _ = printed(capsys, EO1)
    tile = yaml.safe_load(text)["pipeline"]["stages"]["tile"]
    given = "{" + ", ".join(f"{key}: {value}" for key, value in tile.items()) + "}"
    again = built_stage(EO1 + [f"pipeline.stages.tile={given}"], "tile")
    assert (again.tile_size, again.stride) == (tile["tile_size"], tile["stride"]) == (224, 196)


def test_a_llava_pipeline_prints_the_checkpoints_facts_the_run_reads(capsys):
    text, lines = printed(capsys, ["pipeline=llava_chat"])
    cfg = yaml.safe_load(text)
    checkpoint = json.loads((Path(cfg["model"]["path"]) / "config.json").read_text())
    vision = checkpoint["vision_config"]
    assert cfg["engine"]["max_model_len"] == checkpoint["text_config"]["max_position_embeddings"]
    assert cfg["model"]["vision_language"] == {
        "image_input_type": "pixel_values", "image_token_id": checkpoint["image_token_index"],
        "image_input_shape": [3, vision["image_size"], vision["image_size"]],
        "image_feature_size": (vision["image_size"] // vision["patch_size"]) ** 2, "limit_per_prompt": 1}
    assert f"max_model_len: {cfg['engine']['max_model_len']}  # model: model.path/config.json" in lines
    # The pool engine (the vision tower alone) has no context length to print.
    encode = yaml.safe_load(printed(capsys, ["pipeline=llava_encode"])[0])
    assert encode["engine"]["max_model_len"] is None and encode["model"]["vision_language"]["image_token_id"]


def test_a_model_whose_files_are_not_there_keeps_its_nulls(capsys):
    text, _ = printed(capsys, ["pipeline=llava_chat", "model=llava_1_5_7b"])
    cfg = yaml.safe_load(text)
    assert cfg["model"]["path"] is None and cfg["engine"]["max_model_len"] is None
    assert cfg["model"]["vision_language"]["image_token_id"] is None


@pytest.mark.parametrize("value", [
    "plain", "a: b", "# hash", "x  # y", "null", "12", "1.5", "true", "", " lead", "line\nbreak", "tab\t",
    "quote ' and \"", "${x}", "é ü", 7, 0.0001, 1e-5, True, None, [], {}, ["a\nb", 1, None], {"k": [1, {"j": None}]},
])
def test_commented_yaml_reads_back_to_its_tree_with_notes_as_comments(value):
    tree = {"a": {"b": value, "c": {"d": value}}, "e: f": value}
    notes = {("a", "b"): "override", ("a", "c"): "pipeline: x", ("e: f",): "model: m # n"}
    text = commented_yaml(tree, notes, "header\nlines")
    assert yaml.safe_load(text) == tree
    assert text.startswith("# header\n# lines\n")
    assert text.count("# override") == 1 and text.count("# pipeline: x") == 1
