"""Config values left null that the run reads from the model's checkpoint (its config.json), for
`appliance config` to print. Each comes from the function the run calls: `resolve_vision_language` for the
multimodal facts, `max_model_len` for the context. A model whose files are not there keeps its nulls
(`appliance check` names what is missing)."""
import os
from typing import Any, Dict

from omegaconf import DictConfig

from appliance.config.commented_yaml import Path
from appliance.config.schema import EngineKind
from appliance.errors import ConfigError

CHECKPOINT = "model.path/config.json"
VL_FACTS = ("image_token_id", "image_input_shape", "image_feature_size")  # None for LLaVA-NeXT: per image


def checkpoint_facts(cfg: DictConfig) -> Dict[Path, Any]:
    """{config path: the checkpoint's value} for each key `cfg` leaves null that the run derives."""
    path = cfg.model.path
    if not path or not os.path.isfile(os.path.join(path, "config.json")):
        return {}
    facts: Dict[Path, Any] = {}
    declared = cfg.model.vision_language
    if declared is not None:
        from appliance.vl_config import resolve_vision_language

        resolved = resolve_vision_language(cfg.model)
        for name in VL_FACTS:
            value = getattr(resolved, name)
            if declared[name] is None and value is not None:
                facts[("model", "vision_language", name)] = list(value) if isinstance(value, tuple) else value
    if cfg.engine.kind == EngineKind.generate and cfg.engine.max_model_len is None:
        facts[("engine", "max_model_len")] = _context_length(path)
    return facts


def _context_length(path: str) -> int:
    from transformers import AutoConfig

    from appliance.engine.model_fit import max_model_len

    try:
        hf_config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        first_line = str(e).splitlines()[0]
        raise ConfigError(f"model.path: transformers cannot read {path}/config.json: {first_line}") from None
    return max_model_len(hf_config.get_text_config(), None)
