"""Model registry: HF architecture name -> (module, class). Adding a model is one dict entry.

The class fulfils the contract of its engine kind (`models/base.py`): a `CausalLM` (or
`MultimodalCausalLM`) for engine.kind=generate, a `PoolModel` for engine.kind=pool. `POOL_PARTS` names,
for a generate architecture, the part of it that pool mode runs: engine.kind=pool on a LLaVA-1.5
checkpoint runs its vision tower (`pipeline=llava_encode`).
"""
import importlib
from typing import Optional

from appliance.engine.config import EngineKind
from appliance.engine.models.base import CausalLM, PoolModel

MODEL_REGISTRY = {
    "LlamaForCausalLM": ("appliance.engine.models.llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("appliance.engine.models.llama", "LlamaForCausalLM"),
    "LlavaForConditionalGeneration": ("appliance.engine.models.llava", "LlavaForConditionalGeneration"),
    "LlavaNextForConditionalGeneration": ("appliance.engine.models.llava_next", "LlavaNextForConditionalGeneration"),
    "PrithviSegmentation": ("appliance.engine.models.prithvi", "PrithviSegmentation"),
}

POOL_PARTS = {
    "LlavaForConditionalGeneration": ("appliance.engine.models.llava", "LlavaVisionEncoder"),
}


def model_architecture(declared: Optional[str], hf_config=None, model_path: str = "") -> Optional[str]:
    """The registry key that picks the model class, from `model.architecture` (`declared`) and the
    checkpoint's config.json (`hf_config`, read from `model_path`). A checkpoint in HF layout names its
    own (`architectures[0]`) and that one counts, whatever `declared` says (a vision-language model's
    config must agree with it: vl_config.py); `declared` counts only where the engine reads no
    config.json (pool mode builds its model with the class's `from_config`). ValueError when the
    config.json names none."""
    if hf_config is None:
        return declared
    names = getattr(hf_config, "architectures", None)
    if not names:
        raise ValueError(f"{model_path}/config.json names no architecture (`architectures`); the engine "
                         f"runs: {', '.join(sorted(MODEL_REGISTRY))}")
    return names[0]


def get_model_class(architecture: Optional[str], kind: EngineKind = EngineKind.generate):
    """The class for `architecture` in engine `kind` (generate or pool), imported on demand so a model's
    dependencies load only when it is used. ValueError for an unknown architecture (listing the
    registered ones; None, none declared, is one) or one without that kind."""
    entry = None
    if architecture is not None:
        entry = (POOL_PARTS.get(architecture) if kind is EngineKind.pool else None) or MODEL_REGISTRY.get(architecture)
    if entry is None:
        raise ValueError(f"unknown model architecture {architecture!r}; registered: "
                         f"{', '.join(sorted(MODEL_REGISTRY))}")
    module, name = entry
    cls = getattr(importlib.import_module(module), name)
    generates = isinstance(cls, type) and issubclass(cls, CausalLM)
    if kind is EngineKind.generate and not generates:
        raise ValueError(f"model architecture {architecture!r} ({name}) is not a generating model; run it "
                         f"with engine.kind=pool")
    if kind is EngineKind.pool and (generates or not isinstance(cls, PoolModel)):
        raise ValueError(f"model architecture {architecture!r} ({name}) has no pool mode; run it with "
                         f"engine.kind=generate")
    return cls
