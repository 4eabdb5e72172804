"""Check that a model's files are where the config says, without loading any weights."""
import json
from pathlib import Path

from omegaconf import DictConfig

from appliance.errors import ConfigError


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
            raise ConfigError(f"model.checkpoint: {checkpoint} is not a file")
        if checkpoint.suffix not in (".pt", ".pth", ".ckpt", ".safetensors"):
            raise ConfigError(f"model.checkpoint: {checkpoint} is not a .pt/.pth/.ckpt/.safetensors file")


def check_hf_directory(path: Path) -> dict:
    """Return the parsed config.json of an HF model directory, or name what is missing."""
    if not path.is_dir():
        raise ConfigError(f"model.path: {path} is not a directory")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"model.path: {path} has no config.json (expected an HF model directory)")
    if not any(path.glob("*.safetensors")):
        raise ConfigError(f"model.path: {path} has no *.safetensors weights")
    try:
        return json.loads(config_file.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"model.path: {config_file} is not valid JSON ({e})") from None
