"""AWQ checkpoints (4-bit, GEMM layout, as AutoAWQ publishes them and vLLM loads them): the format's
config and its layers' packing and formula (quantized_checkpoint.py reads them as int4 weights).

config.json declares `quantization_config: {"quant_method": "awq", "bits": 4, "group_size": G,
"zero_point": true, "version": "gemm"}`. Each quantised linear X holds `X.qweight` int32 [K, N/8],
`X.qzeros` int32 [K/G, N/8] and `X.scales` fp16 [K/G, N] (in, out: transposed from nn.Linear's weight);
an int32 holds eight 4-bit values, its nibble j (bits 4j..4j+3) column PACK_ORDER[j] of its eight, and
w[k, n] = (q[k, n] - z[k/G, n]) · s[k/G, n]. Layers named in `modules_to_not_convert` stay plain.

A layer becomes torch's int4 convention (w = (q - 8) · scale + zero): q [N, K], scale = s and
zero = (8 - z) · s [N, K/G], since (q - z) · s = (q - 8) · s + (8 - z) · s. In fp32 both terms are exact
(an fp16 scale times a small integer), so the weights are the format's to the bit; a bf16 engine or
int4 kernel rounds s and (8 - z) · s to bf16.
"""
from dataclasses import dataclass
from typing import Dict, Sequence, Tuple

import torch

from appliance.engine.int4 import MIDPOINT
from appliance.errors import ConfigError

PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # the column of its eight that an int32's nibble j holds


@dataclass(frozen=True)
class AwqFormat:
    group_size: int  # inputs sharing a scale and a zero
    name: str = "AWQ"
    parts: Tuple[str, ...] = ("qweight", "qzeros", "scales")

    def dense_shape(self, qweight_shape: Sequence[int]) -> Tuple[int, int]:
        """[N, K] of the nn.Linear weight a layer's qweight [K, N/8] holds."""
        return int(qweight_shape[1]) * 8, int(qweight_shape[0])

    def check_layers(self, path: str) -> None:
        """Nothing to read: every layer the config admits loads."""

    def int4_groups(self, layer: str, parts: Dict[str, torch.Tensor]
                    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Layer `layer`'s (q [N, K], scale [N, K/G], zero [N, K/G]) in torch's int4 convention, fp32
        (exact); ValueError naming a part of the wrong shape."""
        qweight, qzeros, scales = (parts[p] for p in self.parts)
        n, k = self.dense_shape(qweight.shape)
        g = self.group_size
        expected = {"qweight": (k, n // 8), "qzeros": (k // g, n // 8), "scales": (k // g, n)}
        for part in self.parts:
            if tuple(parts[part].shape) != expected[part] or k % g:
                raise ValueError(f"{layer}.{part} has shape {tuple(parts[part].shape)}; AWQ in groups of {g} "
                                 f"with qweight {tuple(qweight.shape)} needs {expected[part]}")
        scale = scales.float()
        zero = (MIDPOINT - unpack(qzeros)) * scale
        return unpack(qweight).t(), scale.t(), zero.t()


def awq_format(quant: dict, where: str, group_size: int) -> AwqFormat:
    """The AWQ format `quant` (a config.json's quantization_config, at `where`; its bits and group size
    checked already) declares; ConfigError naming the field this engine cannot load."""
    if str(quant.get("version", "gemm")).lower() != "gemm":
        raise ConfigError(f"{where}.version={quant.get('version')}: only AWQ's GEMM layout loads (version gemm)",
                          param="model.path")
    if quant.get("zero_point", True) is not True:
        raise ConfigError(f"{where}.zero_point={quant.get('zero_point')}: only AWQ with zero points loads",
                          param="model.path")
    return AwqFormat(group_size)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, C] of AWQ-packed nibbles -> their values, int32 [R, 8C] in column order."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    nibbles = (packed[..., None] >> shifts) & 0xF  # [R, C, 8]: nibble j of each int32
    values = torch.empty_like(nibbles)
    values[..., list(PACK_ORDER)] = nibbles
    return values.reshape(packed.shape[0], -1)
