"""What the engine needs from a model: the contracts a registered model class fulfils.

- `CausalLM` (engine.kind=generate): built as `cls(hf_config, parallel_state, attention_backend,
  max_positions)` by the model runner, which then loads it (`load_weights`), sizes the KV pool from its
  `attention_layers()` and runs `forward` / `compute_logits` each step.
- `MultimodalCausalLM`: a CausalLM that also turns `ImageItem`s into embeddings; the engine checks each
  item when it is added (`image_item_check`, config arithmetic only) and the runner embeds the step's
  new images in one call (`embed_images`).
- `PoolModel` (engine.kind=pool): a class with `from_config(model_cfg, engine_cfg)` returning a module
  whose forward maps a batch [B, ...] to [B, ...] (PoolEngine stacks items and scatters the rows back).

The abstract methods make a model that lacks one fail when it is built, naming the method, instead of
at its first request.
"""
from abc import ABC, abstractmethod
from typing import (TYPE_CHECKING, Any, Callable, ClassVar, Dict, Iterable, List, Optional, Protocol, Tuple,
                    runtime_checkable)

import torch
from torch import nn

if TYPE_CHECKING:  # the pool path imports this module alone, without the attention layers
    from appliance.engine.attention import PagedAttention


class CausalLM(nn.Module, ABC):
    # checkpoint name fragment -> (our fused parameter fragment, shard id), e.g. q_proj -> (qkv_proj, "q")
    packed_modules_mapping: ClassVar[Dict[str, Tuple[str, Any]]] = {}
    tie_word_embeddings: bool = False  # the LM head shares the embedding's weight (not loaded twice)

    @abstractmethod
    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[T] token ids -> [T, hidden] embeddings (the runner overwrites image placeholder rows)."""

    @abstractmethod
    def forward(self, input_ids: Optional[torch.Tensor], positions: torch.Tensor, ctx,
                inputs_embeds: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Hidden states [T, hidden] of the step's flattened tokens (ids, or precomputed embeddings);
        `ctx` is the step's StepContext, which every attention layer reads."""

    @abstractmethod
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[S, hidden] -> [S, vocab] (the full vocabulary on every tensor-parallel rank)."""

    @abstractmethod
    def attention_layers(self) -> List["PagedAttention"]:
        """The PagedAttention layers, in order; the runner gives each its K/V views of the pool."""

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        """Checkpoint (name, tensor) pairs into the parameters (q/k/v and gate/up fused per
        `packed_modules_mapping`). Models with other checkpoint layouts override it."""
        from appliance.engine.loader import load_named_weights  # the pool path imports this module alone

        load_named_weights(self, weights, self.skip_param)

    def skip_param(self, name: str) -> bool:
        """Checkpoint tensors that have no parameter of their own."""
        return "rotary_emb.inv_freq" in name or (self.tie_word_embeddings and name == "lm_head.weight")


class MultimodalCausalLM(CausalLM):
    @classmethod
    @abstractmethod
    def image_item_check(cls, hf_config) -> Callable[[Any], None]:
        """What the engine calls on each ImageItem in add_request: raises ValueError unless the item's
        input has this model's shape and `num_tokens` its count. The config's arithmetic is done here,
        once (reading a transformers config's attributes is slow, and every request would)."""

    @abstractmethod
    def embed_images(self, items: List) -> List[torch.Tensor]:
        """[num_tokens, text hidden] per ImageItem: what replaces its placeholder embeddings."""

    def image_embeddings(self, item) -> torch.Tensor:
        return self.embed_images([item])[0]


@runtime_checkable
class PoolModel(Protocol):
    @classmethod
    def from_config(cls, model_cfg, engine_cfg) -> nn.Module:
        """The model of `model_cfg` on `engine_cfg`'s device and dtype, weights loaded."""
