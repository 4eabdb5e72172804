"""Segmentation neck, UperNet decoder and head of the Prithvi flood models.

Names follow terratorch's modules so that checkpoints load unchanged: the neck is a sequence
(select layers, tokens to image, learned pyramid) whose parameters live at `neck.2.fpn{1,2}`, the decoder
is terratorch's `UperNetDecoder` (`psp_modules`, `bottleneck`, `lateral_convs`, `fpn_convs`,
`fpn_bottleneck`, each a `ConvModule` with `conv` and `norm`), and the head is `head.head.2`.
"""
from typing import List, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn


class SelectIndices(nn.Module):
    """Parameter-free placeholder for neck step 0: the encoder itself returns only the selected layers."""

    def __init__(self, indices: Sequence[int]):
        super().__init__()
        self.indices = list(indices)


class TokensToImage(nn.Module):
    """[B, 1 + T*h*w, D] token sequences -> [B, T*D, h, w] images, dropping the CLS token.

    The grid comes from the patch embedding rather than being guessed from the token count, so
    non-square inputs need no special case. Channels are ordered (t, d), as in the reference.
    """

    def forward(self, features: List[torch.Tensor], grid: Tuple[int, int, int]) -> List[torch.Tensor]:
        t, h, w = grid
        out = []
        for x in features:
            b, _, d = x.shape
            x = x[:, 1:].reshape(b, t, h, w, d).permute(0, 1, 4, 2, 3)
            out.append(x.reshape(b, t * d, h, w))
        return out


class LearnedPyramid(nn.Module):
    """Four same-scale maps -> strides 4, 8, 16, 32 of the input (from patch stride 16).

    fpn1: ConvT 2x2/2, BN, GELU, ConvT 2x2/2 (x4, C/4 ch); fpn2: ConvT 2x2/2 (x2, C/2 ch);
    fpn3: identity; fpn4: max-pool 2 (x1/2).
    """

    def __init__(self, channels: Sequence[int]):
        super().__init__()
        c0, c1 = channels[0], channels[1]
        self.fpn1 = nn.Sequential(
            nn.ConvTranspose2d(c0, c0 // 2, 2, 2),
            nn.BatchNorm2d(c0 // 2),
            nn.GELU(),
            nn.ConvTranspose2d(c0 // 2, c0 // 4, 2, 2),
        )
        self.fpn2 = nn.Sequential(nn.ConvTranspose2d(c1, c1 // 2, 2, 2))
        self.fpn3 = nn.Sequential(nn.Identity())
        self.fpn4 = nn.Sequential(nn.MaxPool2d(kernel_size=2, stride=2))
        self.out_channels = [c0 // 4, c1 // 2, channels[2], channels[3]]

    def forward(self, features: List[torch.Tensor]) -> List[torch.Tensor]:
        fpns = (self.fpn1, self.fpn2, self.fpn3, self.fpn4)
        return [fpn(x) for fpn, x in zip(fpns, features)]


class ConvModule(nn.Module):
    """Conv (no bias) -> BatchNorm -> ReLU."""

    def __init__(self, cin: int, cout: int, kernel_size: int, padding: int = 0):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel_size, padding=padding, bias=False)
        self.norm = nn.BatchNorm2d(cout)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.norm(self.conv(x)))


def _resize(x: torch.Tensor, size) -> torch.Tensor:
    return F.interpolate(x, size=size, mode="bilinear", align_corners=True)


class PPM(nn.ModuleList):
    """Pyramid pooling: adaptive average pool to s x s, 1x1 ConvModule, bilinear back (align_corners=True)."""

    def __init__(self, scales: Sequence[int], cin: int, channels: int):
        super().__init__(nn.Sequential(nn.AdaptiveAvgPool2d(s), ConvModule(cin, channels, 1)) for s in scales)

    def forward(self, x: torch.Tensor) -> List[torch.Tensor]:
        return [_resize(branch(x), x.shape[2:]) for branch in self]


class UperNetDecoder(nn.Module):
    """UperNet: PPM on the coarsest map, top-down FPN, all levels resized to the finest and fused."""

    def __init__(self, in_channels: Sequence[int], channels: int = 256, pool_scales: Sequence[int] = (1, 2, 3, 6)):
        super().__init__()
        self.out_channels = channels
        self.psp_modules = PPM(pool_scales, in_channels[-1], channels)
        self.bottleneck = ConvModule(in_channels[-1] + len(pool_scales) * channels, channels, 3, padding=1)
        self.lateral_convs = nn.ModuleList(ConvModule(c, channels, 1) for c in in_channels[:-1])
        self.fpn_convs = nn.ModuleList(ConvModule(channels, channels, 3, padding=1) for _ in in_channels[:-1])
        self.fpn_bottleneck = ConvModule(len(in_channels) * channels, channels, 3, padding=1)

    def forward(self, inputs: List[torch.Tensor]) -> torch.Tensor:
        top = inputs[-1]
        laterals = [conv(x) for conv, x in zip(self.lateral_convs, inputs)]
        laterals.append(self.bottleneck(torch.cat([top, *self.psp_modules(top)], dim=1)))
        for i in range(len(laterals) - 1, 0, -1):
            laterals[i - 1] = laterals[i - 1] + _resize(laterals[i], laterals[i - 1].shape[2:])
        outs = [conv(x) for conv, x in zip(self.fpn_convs, laterals)] + [laterals[-1]]
        outs = [outs[0]] + [_resize(x, outs[0].shape[2:]) for x in outs[1:]]
        return self.fpn_bottleneck(torch.cat(outs, dim=1))


class SegmentationHead(nn.Module):
    """head = Sequential(identity, dropout, 1x1 conv to classes): key `head.2` as in terratorch."""

    def __init__(self, cin: int, num_classes: int, dropout: float = 0.1):
        super().__init__()
        self.head = nn.Sequential(
            nn.Identity(), nn.Dropout(dropout) if dropout else nn.Identity(), nn.Conv2d(cin, num_classes, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)
