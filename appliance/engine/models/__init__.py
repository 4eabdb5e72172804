"""Model registry: HF architecture name -> (module, class). Adding a model is one dict entry.

Generate models are built as `cls(hf_config, parallel_state, attention_backend, max_positions)` and
expose `forward(input_ids, positions, ctx, inputs_embeds=None)`, `embed_tokens`, `compute_logits`,
`attention_layers()` and `packed_modules_mapping`. Pool models provide
`cls.from_config(model_cfg, engine_cfg) -> nn.Module` whose forward maps [B, ...] -> [B, ...].
"""
import importlib

MODEL_REGISTRY = {
    "LlamaForCausalLM": ("appliance.engine.models.llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("appliance.engine.models.llama", "LlamaForCausalLM"),
    "LlavaForConditionalGeneration": ("appliance.engine.models.llava", "LlavaForConditionalGeneration"),
    "LlavaNextForConditionalGeneration": ("appliance.engine.models.llava_next", "LlavaNextForConditionalGeneration"),
    "PrithviSegmentation": ("appliance.engine.models.prithvi", "PrithviSegmentation"),
}


def get_model_class(architecture: str):
    """Imported on demand, so a model's dependencies load only when it is used."""
    if architecture not in MODEL_REGISTRY:
        raise ValueError(f"unknown model architecture {architecture!r}; registered: "
                         f"{', '.join(sorted(MODEL_REGISTRY))}")
    module, name = MODEL_REGISTRY[architecture]
    return getattr(importlib.import_module(module), name)
