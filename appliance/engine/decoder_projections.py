"""The language model's projections: the weights engine.quantization=int8 or int4 quantizes (linear.py's
column- and row-parallel layers), named as checkpoints name them; a vision tower's layers of the same
names stay in the dtype."""

DECODER_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def is_decoder_projection(name: str) -> bool:
    """Whether checkpoint tensor `name` is a decoder projection's weight."""
    parts = name.split(".")
    return len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in DECODER_PROJECTIONS \
        and "vision_tower" not in parts
