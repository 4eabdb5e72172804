"""What a multimodal request hands the engine: one `ImageItem` per image, in prompt order.

The prompt already holds `num_tokens` copies of the image token id for each item, starting at
`offset`; the engine replaces those positions' embeddings with the model's image embeddings.
`content_hash` identifies the image: it keys the encoder cache and the prefix cache (via mm_ranges).
"""
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch


@dataclass
class ImageItem:
    content_hash: str
    offset: int  # index in the prompt of the item's first placeholder token
    num_tokens: int  # placeholder tokens = image embeddings the model produces for this item
    pixel_values: Optional[torch.Tensor] = None  # image_input_type=pixel_values: [3,H,W] or NeXT [1+tiles,3,H,W]
    image_size: Optional[Tuple[int, int]] = None  # (height, width) of the original image (NeXT unpadding)
    features: Optional[torch.Tensor] = None  # image_input_type=image_features: tower output [tokens, hidden]


def mm_ranges(items: List[ImageItem]) -> List[Tuple[str, int, int]]:
    """The (mm_hash, start, length) runs the scheduler and prefix cache key on."""
    return [(item.content_hash, item.offset, item.num_tokens) for item in items]


def image_token_id(hf_config) -> Optional[int]:
    """The image placeholder token of a multimodal checkpoint's config (`image_token_id`; older configs
    name it `image_token_index`); None for a text-only model."""
    token = getattr(hf_config, "image_token_id", None)
    return token if token is not None else getattr(hf_config, "image_token_index", None)
