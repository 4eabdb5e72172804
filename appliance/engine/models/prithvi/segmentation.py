"""Prithvi-EO segmentation model as terratorch's EncoderDecoderFactory builds it for Sen1Floods11.

pad (reflect, to a multiple of 2 x patch, split between both sides) -> ViT encoder (selected blocks)
-> tokens to image -> learned pyramid -> UperNet -> dropout + 1x1 conv -> bilinear resize to the padded
size (align_corners=False) -> centre crop back to the input size.

`build_prithvi_segmentation` and `load_prithvi` build this layout or hls-foundation-os's
(`conv_transpose_fcn.py`), as `prithvi.decoder` says; both answer to the registry's `PrithviSegmentation`.
"""
from enum import Enum

import torch
from torch import nn

from appliance.engine.config import resolve_dtype
from appliance.errors import ConfigError

from .conv_transpose_fcn import PrithviFCNSegmentation
from .decoder import LearnedPyramid, SegmentationHead, SelectIndices, TokensToImage, UperNetDecoder
from .encoder import PrithviViT
from .loader import load_state, normalize_state_dict, read_checkpoint
from .model_input import TileSegmentation


class PrithviSegmentation(TileSegmentation):
    encoder_prefix = "encoder"  # where the encoder's keys start in a checkpoint

    def __init__(self, encoder: PrithviViT, selected_indices, decoder_channels: int, num_classes: int,
                 head_dropout: float = 0.1, date_major: bool = False):
        super().__init__(date_major)
        depth = encoder.depth
        if len(selected_indices) != 4 or not all(-depth <= i < depth for i in selected_indices):
            raise ValueError(
                f"selected_indices must name 4 encoder blocks in [-{depth}, {depth}), got {list(selected_indices)}"
            )
        indices = [i % depth for i in selected_indices]
        self.encoder = encoder
        self.indices = indices
        pyramid = LearnedPyramid([encoder.out_channels] * 4)
        # Parameter-free steps keep their slots so the pyramid's keys are `neck.2.fpn*` as in terratorch.
        self.neck = nn.Sequential(SelectIndices(indices), TokensToImage(), pyramid)
        self.decoder = UperNetDecoder(pyramid.out_channels, decoder_channels)
        self.head = SegmentationHead(decoder_channels, num_classes, head_dropout)

    @classmethod
    def from_config(cls, model_cfg, engine_cfg=None) -> nn.Module:
        """Registry entry point for pool models: load `model_cfg.checkpoint` (either layout), move to the
        engine's device/dtype."""
        if engine_cfg is None:
            return load_prithvi(model_cfg)
        model = load_prithvi(model_cfg, resolve_dtype(engine_cfg.dtype))  # read once, in the engine's dtype
        return model.to(device=engine_cfg.device)

    @property
    def pad_multiple(self) -> int:
        """Inputs are padded to this multiple of pixels (2 x patch) so that the pyramid's max-pool is exact."""
        return 2 * self.encoder.patch_size[1]

    def logits(self, x: torch.Tensor, temporal_coords, location_coords) -> torch.Tensor:
        """Padded [B, C, T, H, W] -> logits at a quarter of its size (TileSegmentation resizes them)."""
        features = self.encoder(x, self.indices, temporal_coords, location_coords)
        _, tokens_to_image, pyramid = self.neck
        features = pyramid(tokens_to_image(features, self.encoder.token_grid(x)))
        return self.head(self.decoder(features))


def build_prithvi_segmentation(prithvi_cfg, in_chans: int, head_dropout: float = 0.1) -> nn.Module:
    """Build the model (random weights) from a `PrithviConfig`-shaped dataclass or DictConfig: a
    `PrithviSegmentation` (UperNet) or a `PrithviFCNSegmentation`, as `prithvi_cfg.decoder` says."""
    encoder = PrithviViT(
        in_chans=in_chans,
        embed_dim=prithvi_cfg.embed_dim,
        depth=prithvi_cfg.depth,
        num_heads=prithvi_cfg.num_heads,
        patch_size=prithvi_cfg.patch_size,
        tubelet_size=prithvi_cfg.tubelet_size,
        num_frames=prithvi_cfg.num_frames,
        img_size=prithvi_cfg.img_size,
        mlp_ratio=prithvi_cfg.mlp_ratio,
        coords_encoding=list(prithvi_cfg.coords_encoding or []),
        coords_scale_learn=prithvi_cfg.coords_scale_learn,
    )
    decoder = prithvi_cfg.decoder.value if isinstance(prithvi_cfg.decoder, Enum) else prithvi_cfg.decoder
    if decoder not in ("upernet", "conv_transpose_fcn"):
        raise ConfigError(f"model.prithvi.decoder must be upernet or conv_transpose_fcn, got {decoder!r}")
    if decoder == "conv_transpose_fcn":
        return PrithviFCNSegmentation(
            encoder, prithvi_cfg.neck_channels or encoder.out_channels, prithvi_cfg.decoder_channels,
            prithvi_cfg.head_convs, prithvi_cfg.num_classes, head_dropout, prithvi_cfg.date_major_reshape,
        )
    return PrithviSegmentation(
        encoder, list(prithvi_cfg.selected_indices), prithvi_cfg.decoder_channels, prithvi_cfg.num_classes,
        head_dropout, prithvi_cfg.date_major_reshape,
    )


def load_prithvi(model_cfg, dtype: torch.dtype = torch.float32) -> nn.Module:
    """Build the model described by `model_cfg` (a ModelConfig) and load `model_cfg.checkpoint`.

    Returns the model in `dtype` on the CPU in eval mode (built on the meta device: no random
    initialisation, one copy of the weights); the caller moves it to its device.
    """
    if model_cfg.prithvi is None or model_cfg.geo is None:
        raise ConfigError(f"model {model_cfg.name!r}: a Prithvi model needs both `prithvi` and `geo` sections")
    if not model_cfg.checkpoint:
        raise ConfigError(f"model {model_cfg.name!r} has no checkpoint; pass model.checkpoint=PATH")
    path = str(model_cfg.checkpoint)
    state = normalize_state_dict(read_checkpoint(path))
    with torch.device("meta"):
        model = build_prithvi_segmentation(model_cfg.prithvi, in_chans=len(model_cfg.geo.bands))
    load_state(model, state, path, dtype)
    return model.eval()
