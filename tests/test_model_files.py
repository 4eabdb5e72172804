"""`check_model_files`: a model's files named before any weights load; a Hub repository id where a
local path belongs gets how to download it, since the appliance never fetches weights."""
import pytest
from omegaconf import OmegaConf

from appliance.errors import ConfigError
from appliance.model_files import check_model_files
from tests.conftest import REPO, run_cli

LLAVA_TINY = REPO / "appliance" / "assets" / "models" / "llava_tiny"


def model(path=None, checkpoint=None):
    return OmegaConf.create({"name": "m", "path": path, "checkpoint": checkpoint})


@pytest.mark.parametrize("label,cfg,expected", [
    ("hub id as path", model(path="llava-hf/llava-1.5-7b-hf"),
     "model.path: llava-hf/llava-1.5-7b-hf is not a directory; hub ids are not fetched: download with "
     "`hf download llava-hf/llava-1.5-7b-hf --local-dir DIR` and set model.path=DIR"),
    ("hub id as checkpoint", model(checkpoint="ibm-nasa-geospatial/Prithvi-EO-2.0-300M-TL-Sen1Floods11"),
     "model.checkpoint: ibm-nasa-geospatial/Prithvi-EO-2.0-300M-TL-Sen1Floods11 is not a file; hub ids are "
     "not fetched: download with `hf download ibm-nasa-geospatial/Prithvi-EO-2.0-300M-TL-Sen1Floods11 "
     "--include '*.pt' --local-dir DIR` and set model.checkpoint=DIR/FILE.pt"),
    ("absolute path", model(path="/models/llava-1.5-7b-hf"), "model.path: /models/llava-1.5-7b-hf is not a directory"),
    ("relative path", model(path="./llava"), "model.path: llava is not a directory"),
    ("one name", model(path="llava"), "model.path: llava is not a directory"),
    ("three parts", model(path="a/b/c"), "model.path: a/b/c is not a directory"),
    ("missing checkpoint file", model(checkpoint="flood.pt"), "model.checkpoint: flood.pt is not a file"),
    ("neither", model(), "model.path: not set for model 'm'"),
], ids=lambda case: case if isinstance(case, str) else None)
def test_missing_model_files_are_named_in_one_line(label, cfg, expected):
    with pytest.raises(ConfigError) as info:
        check_model_files(cfg)
    message = str(info.value)
    assert "\n" not in message
    if "hub id" in label:
        assert message == expected
    else:
        assert message.startswith(expected) and "hub ids" not in message


def test_an_existing_directory_named_like_a_hub_id_is_used(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "llava-hf").mkdir()
    (tmp_path / "llava-hf" / "tiny").symlink_to(LLAVA_TINY)
    check_model_files(model(path="llava-hf/tiny"))  # no error: it is a directory here


@pytest.mark.slow
def test_check_with_a_hub_id_says_how_to_download_it():
    result = run_cli("check", "pipeline=llava_chat", "model=llava_1_5_7b", "model.path=llava-hf/llava-1.5-7b-hf")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "appliance check: error: model.path: llava-hf/llava-1.5-7b-hf is not a directory; hub ids are not "
        "fetched: download with `hf download llava-hf/llava-1.5-7b-hf --local-dir DIR` and set model.path=DIR"]
