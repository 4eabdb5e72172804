"""Check that a model's files are where the config says, without loading any weights."""
import json
import re
from pathlib import Path

from omegaconf import DictConfig

from appliance.errors import ConfigError

# `owner/name`, as the Hugging Face Hub names a repository (what vLLM and transformers take as a model).
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def check_model_files(model: DictConfig) -> None:
    """A model is either an HF directory (`model.path`) or a single checkpoint file (`model.checkpoint`)."""
    if model.path is None and model.checkpoint is None:
        raise ConfigError(
            f"model.path: not set for model '{model.name}'; give model.path=DIR (an HF directory with "
            "config.json and *.safetensors) or model.checkpoint=FILE"
        )
    if model.path is not None:
        check_hf_directory(Path(model.path))
    if model.checkpoint is not None:
        checkpoint = Path(model.checkpoint)
        if not checkpoint.is_file():
            raise ConfigError(f"model.checkpoint: {model.checkpoint} is not a file" + hub_hint(
                str(model.checkpoint), "--include '*.pt' --local-dir DIR", "model.checkpoint=DIR/FILE.pt"))
        if checkpoint.suffix not in (".pt", ".pth", ".ckpt", ".safetensors"):
            raise ConfigError(f"model.checkpoint: {checkpoint} is not a .pt/.pth/.ckpt/.safetensors file")


def check_hf_directory(path: Path) -> dict:
    """Return the parsed config.json of an HF model directory, or name what is missing."""
    if not path.is_dir():
        raise ConfigError(f"model.path: {path} is not a directory"
                          + hub_hint(str(path), "--local-dir DIR", "model.path=DIR"))
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"model.path: {path} has no config.json (expected an HF model directory)")
    if not any(path.glob("*.safetensors")):
        raise ConfigError(f"model.path: {path} has no *.safetensors weights")
    try:
        return json.loads(config_file.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"model.path: {config_file} is not valid JSON ({e})") from None


def hub_hint(given: str, download_args: str, setting: str) -> str:
    """What to do when a missing path reads as a Hub repository id: the appliance never downloads weights
    (a pod or a batch job reads them from a volume), so say how to fetch them and where to point."""
    if not HUB_ID.fullmatch(given):
        return ""
    return (f"; hub ids are not fetched: download with `hf download {given} {download_args}` "
            f"and set {setting}")
