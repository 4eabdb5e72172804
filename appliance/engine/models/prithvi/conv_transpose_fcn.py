"""Prithvi-EO segmentation as hls-foundation-os (mmseg) builds it: the Prithvi-EO-1.0 fine-tunes.

pad (reflect, to a multiple of the patch) -> ViT encoder (last block, normalised) -> tokens to image
(channels ordered (d, t)) -> 16x upsampling neck (two pairs of 2x2 ConvTranspose with LayerNorm + GELU
between) -> FCN head (3x3 conv, BN, ReLU; dropout; 1x1 conv) -> bilinear resize to the padded size -> centre
crop. Module names follow the reference so that its checkpoints load unchanged: `backbone.*`,
`neck.fpn{1,2}.{0,1.ln,3}`, `decode_head.convs.N.{conv,bn}`, `decode_head.conv_seg`.
"""
from typing import Tuple

import torch
from torch import nn

from .encoder import PrithviViT
from .model_input import TileSegmentation

NECK_LAYER_NORM_EPS = 1e-6


class LayerNorm2d(nn.Module):
    """LayerNorm over the channels of a [B, C, H, W] map."""

    def __init__(self, channels: int):
        super().__init__()
        self.ln = nn.LayerNorm(channels, eps=NECK_LAYER_NORM_EPS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def upsample_4x(cin: int, cout: int) -> nn.Sequential:
    """ConvT 2x2/2 -> LayerNorm -> GELU -> ConvT 2x2/2."""
    return nn.Sequential(
        nn.ConvTranspose2d(cin, cout, 2, 2), LayerNorm2d(cout), nn.GELU(), nn.ConvTranspose2d(cout, cout, 2, 2)
    )


class ConvTransposeNeck(nn.Module):
    """Token sequences [B, 1 + T*h*w, D] -> an image [B, channels, 16h, 16w].

    The CLS token is dropped and each patch's T frame vectors become its D*T channels, ordered (d, t)
    as the reference's reshape leaves them.
    """

    def __init__(self, in_channels: int, channels: int):
        super().__init__()
        self.fpn1 = upsample_4x(in_channels, channels)
        self.fpn2 = upsample_4x(channels, channels)

    def forward(self, tokens: torch.Tensor, grid: Tuple[int, int, int]) -> torch.Tensor:
        t, h, w = grid
        b, _, d = tokens.shape
        x = tokens[:, 1:].transpose(1, 2).reshape(b, d * t, h, w)
        return self.fpn2(self.fpn1(x))


class ConvBNReLU(nn.Module):
    """3x3 conv (no bias) -> BatchNorm -> ReLU, named as mmcv's ConvModule names them."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.activate = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activate(self.bn(self.conv(x)))


class FCNHead(nn.Module):
    """`num_convs` ConvBNReLU, dropout, 1x1 conv to the classes (mmseg's FCNHead without concat_input)."""

    def __init__(self, cin: int, channels: int, num_convs: int, num_classes: int, dropout: float = 0.1):
        super().__init__()
        self.convs = nn.Sequential(*(ConvBNReLU(cin if i == 0 else channels, channels) for i in range(num_convs)))
        self.dropout = nn.Dropout2d(dropout) if dropout else nn.Identity()
        self.conv_seg = nn.Conv2d(channels if num_convs else cin, num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv_seg(self.dropout(self.convs(x)))


class PrithviFCNSegmentation(TileSegmentation):
    encoder_prefix = "backbone"  # where the encoder's keys start in a checkpoint

    def __init__(self, backbone: PrithviViT, neck_channels: int, head_channels: int, head_convs: int,
                 num_classes: int, head_dropout: float = 0.1, date_major: bool = False):
        super().__init__(date_major)
        self.backbone = backbone
        self.neck = ConvTransposeNeck(backbone.out_channels, neck_channels)
        self.decode_head = FCNHead(neck_channels, head_channels, head_convs, num_classes, head_dropout)

    @property
    def encoder(self) -> PrithviViT:
        """The ViT, under the name both layouts share."""
        return self.backbone

    @property
    def pad_multiple(self) -> int:
        """Inputs are padded to a multiple of the patch: the neck needs whole patches, nothing more."""
        return self.backbone.patch_size[1]

    def logits(self, x: torch.Tensor, temporal_coords, location_coords) -> torch.Tensor:
        """Padded [B, C, T, H, W] -> logits at its size (the neck's 16x undoes the patch's 16); the
        coordinates as `PrithviSegmentation`'s (the published models of this layout use none)."""
        tokens = self.backbone(x, [self.backbone.depth - 1], temporal_coords, location_coords)[0]
        return self.decode_head(self.neck(tokens, self.backbone.token_grid(x)))
