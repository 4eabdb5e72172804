"""Llama / Mistral decoder built from the tensor-parallel layers."""
from typing import List, Optional, cast

import torch
from torch import nn

from appliance.engine.attention import PagedAttention
from appliance.engine.attention_geometry import head_dim_of, kv_heads_of
from appliance.engine.context import StepContext
from appliance.engine.decoder_projections import has_bias
from appliance.engine.embedding import ParallelLMHead, VocabParallelEmbedding
from appliance.engine.layers import RMSNorm, RotaryEmbedding, SiluAndMul, rope_parameters
from appliance.engine.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from appliance.engine.models.base import CausalLM
from appliance.engine.parallel import ParallelState


class LlamaAttention(nn.Module):
    def __init__(self, cfg, tp: ParallelState, backend, rotary: RotaryEmbedding):
        super().__init__()
        head_dim = head_dim_of(cfg)
        num_kv = kv_heads_of(cfg)
        bias = has_bias(cfg, "q_proj")
        self.qkv_proj = QKVParallelLinear(cfg.hidden_size, head_dim, cfg.num_attention_heads, num_kv, tp, bias)
        self.o_proj = RowParallelLinear(cfg.num_attention_heads * head_dim, cfg.hidden_size, tp, bias)
        self.q_size = self.qkv_proj.num_heads * head_dim
        self.kv_size = self.qkv_proj.num_kv_heads * head_dim
        self.head_dim = head_dim
        self.rotary = rotary
        self.attn = PagedAttention(self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads, head_dim,
                                   head_dim ** -0.5, backend)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        t = x.shape[0]
        q, k = self.rotary(positions, q.view(t, -1, self.head_dim), k.view(t, -1, self.head_dim))
        return self.o_proj(self.attn(q, k, v, ctx))


class LlamaMLP(nn.Module):
    def __init__(self, cfg, tp: ParallelState):
        super().__init__()
        bias = has_bias(cfg, "gate_proj")
        self.gate_up_proj = MergedColumnParallelLinear(cfg.hidden_size, [cfg.intermediate_size] * 2, tp, bias)
        self.down_proj = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size, tp, bias)
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg, tp: ParallelState, backend, rotary: RotaryEmbedding):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg, tp, backend, rotary)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg, tp)

    def forward(self, positions, x, ctx):
        x = x + self.self_attn(positions, self.input_layernorm(x), ctx)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg, tp: ParallelState, backend, max_positions: int):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
        # One cos/sin table for every layer (the same positions and frequencies): at 7B shape, 32 tables
        # of 4 MiB otherwise, each computed at start-up.
        rotary = RotaryEmbedding(head_dim_of(cfg), max_positions, rope_parameters(cfg))
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, tp, backend, rotary)
                                    for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, positions, ctx, input_ids=None, inputs_embeds=None):
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        for layer in self.layers:
            x = layer(positions, x, ctx)
        return self.norm(x)


class LlamaForCausalLM(CausalLM):
    # checkpoint name fragment -> (our fused parameter fragment, shard id)
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, cfg, tp: ParallelState, backend, max_positions: Optional[int] = None):
        super().__init__()
        self.config = cfg
        max_positions = max_positions or cfg.max_position_embeddings
        self.model = LlamaModel(cfg, tp, backend, max_positions)
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, tp)
        self.tie_word_embeddings = bool(getattr(cfg, "tie_word_embeddings", False))
        if self.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(self, input_ids: Optional[torch.Tensor], positions: torch.Tensor, ctx: StepContext,
                inputs_embeds: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Hidden states [T, hidden] for the step's flattened tokens (ids, or precomputed embeddings)."""
        return self.model(positions, ctx, input_ids=input_ids, inputs_embeds=inputs_embeds)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head.compute_logits(hidden)

    def attention_layers(self) -> List[PagedAttention]:
        # nn.ModuleList is not generic: its items read as plain Modules
        return [cast(LlamaDecoderLayer, layer).self_attn.attn for layer in self.model.layers]
