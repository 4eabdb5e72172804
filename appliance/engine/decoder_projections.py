"""The language model's projections: the weights engine.quantization=int8 or int4 quantizes (linear.py's
column- and row-parallel layers), named as checkpoints name them; a vision tower's layers of the same
names stay in the dtype."""
from typing import Optional

DECODER_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def is_decoder_projection(name: str) -> bool:
    """Whether checkpoint tensor `name` is a decoder projection's weight."""
    parts = name.split(".")
    return len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in DECODER_PROJECTIONS \
        and "vision_tower" not in parts


# The text config's flag that gives a decoder projection a bias, as the Llama decoder (models/llama.py)
# reads it; unset: no bias.
BIAS_FLAGS = {"q_proj": "attention_bias", "k_proj": "attention_bias", "v_proj": "attention_bias",
              "o_proj": "attention_bias", "gate_proj": "mlp_bias", "up_proj": "mlp_bias", "down_proj": "mlp_bias"}


def has_bias(text_config, projection: str) -> bool:
    """Whether the decoder built from `text_config` gives its `projection` (q_proj, ...) a bias."""
    return bool(getattr(text_config, BIAS_FLAGS[projection], False))


def biased_projection(name: str) -> Optional[str]:
    """The projection (q_proj, ...) whose bias checkpoint tensor `name` is; None for any other tensor."""
    layer, _, part = name.rpartition(".")
    return layer.rpartition(".")[2] if part == "bias" and is_decoder_projection(f"{layer}.weight") else None
