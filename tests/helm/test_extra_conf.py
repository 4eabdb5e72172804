"""$APPLIANCE_EXTRA_CONF_DIR: group files beside conf/'s (the chart's `extraConfig` mounts there)."""
import pytest

from appliance.config.compose import compose, group_options
from appliance.errors import ConfigError

PIPELINE = """\
# @package _global_
defaults:
  - override /model: my_model
  - override /engine: pool
pipeline:
  name: my_flood
  inputs: [input, output, overwrite]
  stages:
    raster_inputs: {}
    raster_read: {}
    tile: {tile_size: 256}
    normalize: {}
    engine: {}
    stitch: {}
    raster_write: {}
"""
MODEL = """\
defaults: [schema, _self_]
name: my-model
architecture: PrithviSegmentation
checkpoint: ${asset:models/prithvi_demo_flood/model.safetensors}
prithvi: {embed_dim: 64, depth: 4, num_heads: 2, patch_size: 16, selected_indices: [0, 1, 2, 3],
          decoder_channels: 32, num_classes: 2}
geo:
  bands: [BLUE, GREEN, RED, NIR_NARROW, SWIR_1, SWIR_2]
  means: [0.14, 0.14, 0.12, 0.31, 0.20, 0.12]
  stds: [0.07, 0.07, 0.09, 0.12, 0.10, 0.08]
  scale: 0.0001
  class_names: [land, water]
"""


@pytest.fixture
def extra(tmp_path, monkeypatch):
    for relative, text in {"pipeline/my_flood.yaml": PIPELINE, "model/my_model.yaml": MODEL}.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    monkeypatch.setenv("APPLIANCE_EXTRA_CONF_DIR", str(tmp_path))
    return tmp_path


def test_extra_files_join_the_groups(extra):
    assert {"my_flood", "prithvi_flood"} <= set(group_options("pipeline"))
    assert {"my_model", "prithvi_demo_flood"} <= set(group_options("model"))
    cfg = compose(["pipeline=my_flood"])
    assert (cfg.pipeline.name, cfg.model.name, cfg.engine.kind.value) == ("my_flood", "my-model", "pool")
    assert cfg.pipeline.stages.tile.tile_size == 256


def test_an_extra_model_under_a_shipped_pipeline(extra):
    cfg = compose(["pipeline=prithvi_flood", "model=my_model"])
    assert cfg.pipeline.name == "prithvi_flood" and cfg.model.name == "my-model"


def test_an_unknown_choice_lists_the_extra_files_too(extra):
    with pytest.raises(ConfigError, match=r"pipeline=my_flod: no such pipeline \(available: .*my_flood"):
        compose(["pipeline=my_flod"])


def test_unset_means_conf_alone(monkeypatch):
    monkeypatch.delenv("APPLIANCE_EXTRA_CONF_DIR", raising=False)
    assert "my_flood" not in group_options("pipeline")


def test_a_missing_directory_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("APPLIANCE_EXTRA_CONF_DIR", str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match=r"APPLIANCE_EXTRA_CONF_DIR=.*nope: no such directory"):
        compose([])


def test_a_file_shadowing_a_shipped_one_is_refused(extra):
    (extra / "pipeline" / "prithvi_flood.yaml").write_text(PIPELINE)
    with pytest.raises(ConfigError, match=r"pipeline/prithvi_flood.yaml in \$APPLIANCE_EXTRA_CONF_DIR .* another name"):
        compose(["pipeline=my_flood"])
