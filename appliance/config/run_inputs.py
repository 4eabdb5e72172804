"""`appliance check`'s look at the run's own inputs: every local file named by a key the schema marks
LOCAL_PATHS (`input=`, `prompt_file=`) and the pipeline takes must exist and be readable. URLs (`https://`,
`s3://`, `data:`) are left to the run, which fetches them under its own limits."""
import os
from typing import Any, Iterator

from omegaconf import OmegaConf

from appliance.config.schema import local_path_keys
from appliance.errors import InputError


def check_local_inputs(cfg: Any) -> None:
    """InputError naming the key and the file when a local input cannot be read."""
    for key in local_path_keys():
        if key not in cfg.pipeline.inputs:
            continue
        for path in _paths(cfg.get(key)):
            if "://" in path or path.startswith("data:"):
                continue
            if not os.path.exists(path):
                raise InputError(f"{key}: {path}: no such file", param=key)
            if os.path.isdir(path):
                raise InputError(f"{key}: {path} is a directory; expected a file", param=key)
            try:
                with open(path, "rb"):
                    pass
            except OSError as e:
                raise InputError(f"{key}: cannot read {path} ({e.strerror or e})", param=key) from None


def _paths(value: Any) -> Iterator[str]:
    """Every path in a value: one path, a list of them, or lists of per-band paths."""
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value)
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from _paths(item)
    elif value not in (None, ""):
        yield str(value)
