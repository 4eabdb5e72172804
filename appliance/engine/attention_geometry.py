"""A model's attention shape on one tensor-parallel rank and the bytes of its KV cache: the one place a
checkpoint's config is read for heads, KV heads and head dim, and the one formula for a KV block's
bytes. The models build their layers from it, the memory plan sizes the cache with it, the runner
allocates the pool with it, the attention probe and the config check test kernels against it."""
from dataclasses import dataclass

import torch


def head_dim_of(text_config) -> int:
    """`head_dim` when the config sets it, else hidden_size / num_attention_heads (transformers' rule)."""
    return getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads


def kv_heads_of(text_config) -> int:
    """`num_key_value_heads` when the config sets it (grouped-query attention), else one a query head."""
    return getattr(text_config, "num_key_value_heads", None) or text_config.num_attention_heads


@dataclass(frozen=True)
class AttentionGeometry:
    """One rank's attention shape (what a backend's kernels must accept) and, with `num_layers`, its KV
    cache's (a probe of one layer's kernels leaves it at 1)."""

    num_heads: int  # on this rank
    num_kv_heads: int  # on this rank
    head_dim: int
    block_size: int
    num_layers: int = 1

    @classmethod
    def of(cls, hf_config, world_size: int, block_size: int) -> "AttentionGeometry":
        """The language model's geometry on each of `world_size` ranks."""
        text = hf_config.get_text_config()
        heads = text.num_attention_heads
        return cls(max(heads // world_size, 1), max(kv_heads_of(text) // world_size, 1), head_dim_of(text),
                   block_size, text.num_hidden_layers)

    def block_bytes(self, dtype: torch.dtype) -> int:
        """One KV block: K and V of `block_size` tokens in every layer."""
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * dtype.itemsize

    def bytes_for(self, tokens: int, dtype: torch.dtype) -> int:
        """Whole blocks for `tokens` tokens."""
        return -(-tokens // self.block_size) * self.block_bytes(dtype)
