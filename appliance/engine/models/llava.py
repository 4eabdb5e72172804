"""LLaVA-1.5: a CLIP vision tower, a 2-layer GELU projector and our Llama as the language model.

The language model is ours (paged attention, tensor-parallel layers, sharded on load). The vision
tower is transformers' `CLIPVisionModel` built from `hf_config.vision_config`, cut after the deepest
layer `vision_feature_layer` reads; it and the projector are replicated on every rank (only rank 0
runs them: the model runner sends the image embeddings to the other ranks with the step).

Image embeddings for one `ImageItem` (`image_embeddings`):
    pixel_values [3, S, S] -> tower hidden states at `vision_feature_layer` (a list: concatenated on the
    feature axis) -> drop CLS ("default") or keep it ("full") -> projector -> [tokens, text hidden]
    features [tokens, vision hidden * k] (image_input_type=image_features) -> projector only
`vision_features(pixel_values)` is the tower-only half, which is what image_features inputs hold.
`LlavaVisionTower` is that half alone (the CLIP tower and the feature selection, no projector, no
language model); `LlavaForConditionalGeneration` extends it, so both share parameter names and
loading. `LlavaVisionEncoder` is the tower as a pool model: what engine.kind=pool runs for a LLaVA-1.5
checkpoint (`pipeline=llava_encode`), building and loading the tower only.

Checkpoint layouts accepted (see `checkpoint_name`): transformers 4.x llava-hf
(`language_model.model.*`, `language_model.lm_head.*`, `vision_tower.vision_model.*`,
`multi_modal_projector.*`), what transformers 5 writes (the same, with `vision_tower.*` unprefixed),
and transformers 5's in-memory names (`model.language_model.*`, `model.vision_tower.*`,
`model.multi_modal_projector.*`, `lm_head.*`).
"""
import re
from typing import Callable, Iterable, List, Optional, Tuple

import torch
from torch import nn

from appliance.engine.config import DType, resolve_dtype
from appliance.engine.context import StepContext
from appliance.engine import loader
from appliance.engine.loader import load_named_weights
from appliance.engine.materialize import build_on_meta, materialize
from appliance.engine.models.base import MultimodalCausalLM
from appliance.engine.models.llama import LlamaForCausalLM
from appliance.engine.multimodal import ImageItem, image_token_id
from appliance.engine.parallel import ParallelState


def feature_layers(hf_config) -> Tuple[int, ...]:
    """`vision_feature_layer` as absolute indices into the tower's hidden states (0 = embeddings)."""
    layer = hf_config.vision_feature_layer
    layers = [layer] if isinstance(layer, int) else list(layer)
    depth = hf_config.vision_config.num_hidden_layers
    out = tuple(i if i >= 0 else depth + 1 + i for i in layers)
    if any(not 0 <= i <= depth for i in out):
        raise ValueError(f"config.json: vision_feature_layer {layer!r} is outside the vision tower's "
                         f"{depth} layers (hidden states 0..{depth}, or -1..-{depth + 1})")
    return out


def checkpoint_name(name: str) -> Optional[str]:
    """Our parameter name for a checkpoint tensor name (any accepted layout); None to skip it."""
    if "rotary_emb.inv_freq" in name or name.endswith("position_ids"):
        return None
    name = re.sub(r"^model\.(language_model|vision_tower|multi_modal_projector|image_newline)", r"\1", name)
    if name.startswith("language_model.") and not name.startswith(("language_model.model.",
                                                                   "language_model.lm_head.")):
        name = "language_model.model." + name[len("language_model."):]  # 5.x: a bare LlamaModel
    elif name.startswith("lm_head."):
        name = "language_model." + name
    elif name.startswith("vision_tower.vision_model."):
        name = "vision_tower." + name[len("vision_tower.vision_model."):]  # 4.x CLIPVisionModel wrapper
    return name


class LlavaProjector(nn.Module):
    def __init__(self, vision_dim: int, text_dim: int, act: str, bias: bool = True):
        super().__init__()
        if act not in ("gelu", "gelu_pytorch_tanh"):
            raise ValueError(f"config.json: projector_hidden_act {act!r} is not supported; "
                             f"use gelu or gelu_pytorch_tanh")
        self.linear_1 = nn.Linear(vision_dim, text_dim, bias=bias)
        self.act = nn.GELU(approximate="tanh" if act == "gelu_pytorch_tanh" else "none")
        self.linear_2 = nn.Linear(text_dim, text_dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class LlavaVisionTower(nn.Module):
    """LLaVA's vision half: the CLIP tower cut after the deepest layer `vision_feature_layer` reads, and
    the feature selection. Its output is what the projector reads and what image_features inputs hold."""

    def __init__(self, hf_config):
        super().__init__()
        from transformers import CLIPVisionConfig, CLIPVisionModel

        vision = hf_config.vision_config
        if getattr(vision, "model_type", "clip_vision_model") != "clip_vision_model":
            raise ValueError(f"config.json: vision_config.model_type {vision.model_type!r} is not supported; "
                             f"only CLIP vision towers (clip_vision_model) are")
        self.select_strategy = hf_config.vision_feature_select_strategy
        if self.select_strategy not in ("default", "full"):
            raise ValueError(f"config.json: vision_feature_select_strategy {self.select_strategy!r}; "
                             f"allowed: default, full")
        self.feature_layers = feature_layers(hf_config)
        # Layers after the deepest selected one never matter: build (and load) the tower without them.
        self.tower_depth = max(self.feature_layers)
        cut = CLIPVisionConfig(**{**vision.to_dict(), "num_hidden_layers": self.tower_depth})
        cut._attn_implementation = "sdpa"
        self.vision_tower = CLIPVisionModel(cut)

    def init_buffers(self) -> None:
        """CLIP's position ids, the tower's one computed buffer, for a tower built on the meta device
        (engine/materialize.py)."""
        for module in self.vision_tower.modules():
            ids = dict(module.named_buffers(recurse=False)).get("position_ids")
            if ids is not None:
                with torch.no_grad():
                    ids.copy_(torch.arange(ids.shape[-1], device=ids.device).expand_as(ids))

    def vision_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Tower output after feature selection: [views, 3, S, S] -> [views, tokens, vision hidden * k]."""
        p = next(self.vision_tower.parameters())
        out = self.vision_tower(pixel_values.to(p.device, p.dtype), output_hidden_states=True)
        feats = torch.cat([out.hidden_states[i] for i in self.feature_layers], dim=-1)
        return feats[:, 1:] if self.select_strategy == "default" else feats

    def needs(self, checkpoint_tensor: str) -> bool:
        """Whether the tower loads this checkpoint tensor (any layout). Pass it as
        `iter_weights(path, keep=tower.needs)` so the projector and LM tensors are never read."""
        name = checkpoint_name(checkpoint_tensor)
        return name is not None and name.startswith("vision_tower.") and not self.skip_param(name)

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        """The vision tower's tensors of a LLaVA checkpoint; the projector's and the LM's are ignored."""
        load_named_weights(self, ((checkpoint_name(n), t) for n, t in weights if self.needs(n)), self.skip_param)

    def skip_param(self, name: str) -> bool:
        m = re.match(r"vision_tower\.encoder\.layers\.(\d+)\.", name)
        return m is not None and int(m.group(1)) >= self.tower_depth  # a tower layer after the deepest selected one


class LlavaVisionEncoder(LlavaVisionTower):
    """The tower as a pool model (engine.kind=pool on a LLaVA-1.5 checkpoint, `pipeline=llava_encode`):
    a batch of views [B, 3, S, S] -> their features [B, tokens, vision hidden * k]."""

    @classmethod
    def from_config(cls, model_cfg, engine_cfg=None) -> "LlavaVisionEncoder":
        """Build the tower of `model_cfg.path` and read only its tensors (`iter_weights(keep=needs)`)."""
        from transformers import AutoConfig

        if not model_cfg.path:
            raise ValueError("model.path is not set; point it at a HF LLaVA model directory")
        device = torch.device(getattr(engine_cfg, "device", None) or "cpu")
        hf_config = AutoConfig.from_pretrained(model_cfg.path)
        dtype = resolve_dtype(engine_cfg.dtype if engine_cfg is not None else DType.float32)
        tower = materialize(build_on_meta(lambda: cls(hf_config)), device, dtype)
        tower.load_weights(loader.iter_weights(model_cfg.path, keep=tower.needs))
        return tower

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.vision_features(pixel_values)


class LlavaForConditionalGeneration(LlavaVisionTower, MultimodalCausalLM):
    """The vision tower (the base class), the projector and our Llama."""

    packed_modules_mapping = LlamaForCausalLM.packed_modules_mapping  # applied to language_model.* only

    def __init__(self, hf_config, tp: ParallelState, backend, max_positions: Optional[int] = None):
        super().__init__(hf_config)
        self.config = hf_config
        text = hf_config.text_config
        vision = hf_config.vision_config
        self.image_token_id = image_token_id(hf_config)
        self.multi_modal_projector = LlavaProjector(
            vision.hidden_size * len(self.feature_layers), text.hidden_size, hf_config.projector_hidden_act,
            getattr(hf_config, "multimodal_projector_bias", True))
        self.language_model = LlamaForCausalLM(text, tp, backend, max_positions)
        self.tie_word_embeddings = self.language_model.tie_word_embeddings

    # ---- language model ---------------------------------------------------------------------------
    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.language_model.embed_tokens(input_ids)

    def forward(self, input_ids: Optional[torch.Tensor], positions: torch.Tensor, ctx: StepContext,
                inputs_embeds: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.language_model(input_ids, positions, ctx, inputs_embeds)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.language_model.compute_logits(hidden)

    def attention_layers(self):
        return self.language_model.attention_layers()

    # ---- images -----------------------------------------------------------------------------------
    @staticmethod
    def view_tokens(hf_config) -> int:
        """Features one view makes: (S // p)^2 patches, + CLS with the "full" strategy."""
        v = hf_config.vision_config
        return (v.image_size // v.patch_size) ** 2 + (hf_config.vision_feature_select_strategy == "full")

    @classmethod
    def image_item_check(cls, hf_config) -> Callable[[ImageItem], None]:
        """The item's input must have the model's shape and num_tokens its count."""
        v = hf_config.vision_config
        s, tokens = v.image_size, cls.view_tokens(hf_config)
        pixel_shapes: List[Tuple[int, ...]] = [(3, s, s), (1, 3, s, s)]
        feature_shapes: List[Tuple[int, ...]] = [(tokens, v.hidden_size * len(feature_layers(hf_config)))]

        def check(item: ImageItem) -> None:
            if item.pixel_values is not None and item.features is None:
                what, shapes, got = "pixel_values", pixel_shapes, tuple(item.pixel_values.shape)
            elif item.features is not None and item.pixel_values is None:
                what, shapes, got = "features", feature_shapes, tuple(item.features.shape)
            else:
                raise ValueError(f"image {item.content_hash}: give exactly one of pixel_values and features")
            if got not in shapes:
                raise ValueError(f"image {item.content_hash}: {what} has shape {got}; this model takes "
                                 f"{' or '.join(map(str, shapes))}")
            check_num_tokens(item, tokens)

        return check

    def project(self, features: torch.Tensor) -> torch.Tensor:
        p = self.multi_modal_projector.linear_1.weight
        return self.multi_modal_projector(features.to(p.device, p.dtype))

    def embed_images(self, items: List[ImageItem]) -> List[torch.Tensor]:
        """`image_embeddings` of several items, with one tower call over all their views."""
        for item in items:
            if (item.pixel_values is None) == (item.features is None):
                raise ValueError(f"image {item.content_hash}: give exactly one of pixel_values and features")
        views = [self.views(it) for it in items if it.features is None]
        feats = iter(self.vision_features(torch.cat(views)).split([v.shape[0] for v in views]) if views else ())
        return [check_count(self.finish(it, it.features if it.features is not None else next(feats)), it)
                for it in items]

    def views(self, item: ImageItem) -> torch.Tensor:
        """The item's pixel views for the tower, [1, 3, S, S]."""
        given = item.pixel_values
        if given is None:
            raise ValueError(f"image {item.content_hash}: no pixel_values to make its view from")
        pixels = given.unsqueeze(0) if given.dim() == 3 else given
        if pixels.dim() != 4 or pixels.shape[0] != 1:
            raise ValueError(f"image {item.content_hash}: LLaVA pixel_values must be [3, H, W] (one view), "
                             f"got {tuple(given.shape)}")
        return pixels

    def finish(self, item: ImageItem, feats: torch.Tensor) -> torch.Tensor:
        """Tower features of one item ([1, tokens, D] from pixels, [tokens, D] as features) -> embeddings."""
        return self.project(feats[0] if feats.dim() == 3 else feats)

    # ---- weights ----------------------------------------------------------------------------------
    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        """Checkpoint tensors (any layout in the module docstring) into our parameters."""
        # q/k/v and gate/up fusion only under `language_model.`: the CLIP tower keeps its own q/k/v.
        load_named_weights(self, ((checkpoint_name(n), t) for n, t in weights), self.skip_param,
                           fuse_under="language_model.")

    def skip_param(self, name: str) -> bool:
        return super().skip_param(name) or (self.tie_word_embeddings and name == "language_model.lm_head.weight")


def check_num_tokens(item: ImageItem, expected: int) -> None:
    if item.num_tokens != expected:
        raise ValueError(f"image {item.content_hash}: the model makes {expected} image embeddings but the "
                         f"prompt holds {item.num_tokens} placeholder tokens; expand the image token to "
                         f"the model's count")


def check_count(emb: torch.Tensor, item: ImageItem) -> torch.Tensor:
    if emb.dim() != 2 or emb.shape[0] != item.num_tokens:
        raise ValueError(f"image {item.content_hash}: the model makes {emb.shape[0] if emb.dim() == 2 else '?'} "
                         f"image embeddings (shape {tuple(emb.shape)}) but the prompt holds {item.num_tokens} "
                         f"placeholder tokens; expand the image token to the model's count")
    return emb
