"""AWQ checkpoints (4-bit, GEMM layout, as AutoAWQ publishes them and vLLM loads them) read as int4 weights.

config.json declares `quantization_config: {"quant_method": "awq", "bits": 4, "group_size": G,
"zero_point": true, "version": "gemm"}`. Each quantised linear X holds `X.qweight` int32 [K, N/8],
`X.qzeros` int32 [K/G, N/8] and `X.scales` fp16 [K/G, N] (in, out: transposed from nn.Linear's weight);
an int32 holds eight 4-bit values, its nibble j (bits 4j..4j+3) column PACK_ORDER[j] of its eight, and
w[k, n] = (q[k, n] - z[k/G, n]) · s[k/G, n]. The other tensors (embeddings, norms, LM head, vision
tower, projector) are plain.

At load each layer's three tensors become nn.Linear-shaped ones in torch's int4 convention
(w = (q - 8) · scale + zero): `X.weight` = q [N, K], `X.group_scales` = s and `X.group_zeros` =
(8 - z) · s [N, K/G], since (q - z) · s = (q - 8) · s + (8 - z) · s. The projections' own weight loaders
fuse and shard them as any weight (linear.add_int4_groups), and `quantize_projections` packs them
as they are: nothing is quantised again. In fp32 both terms are exact (an fp16 scale times a small
integer), so the weights are the format's to the bit; a bf16 engine or int4 kernel rounds s and
(8 - z) · s to bf16.
"""
import json
import os
from dataclasses import dataclass, replace
from typing import Dict, Iterable, Iterator, Optional, Tuple

import torch

from appliance.engine.config import EngineConfig, Quantization, quantization_group_sizes
from appliance.engine.int4 import MIDPOINT
from appliance.errors import ConfigError

PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # the column of its eight that an int32's nibble j holds
PARTS = ("qweight", "qzeros", "scales")


@dataclass(frozen=True)
class AwqFormat:
    group_size: int  # inputs sharing a scale and a zero


def awq_format(path: str) -> Optional[AwqFormat]:
    """The AWQ format the checkpoint at `path` declares in config.json (None: not AWQ, or no config.json
    to read); ConfigError naming the quantization_config field this engine cannot load."""
    try:
        with open(os.path.join(path, "config.json")) as f:
            quant = json.load(f).get("quantization_config") or {}
    except (OSError, ValueError):
        return None
    if str(quant.get("quant_method", "")).lower() != "awq":
        return None
    where = f"{path}/config.json quantization_config"
    if quant.get("bits") != 4:
        raise ConfigError(f"{where}.bits={quant.get('bits')}: AWQ checkpoints load with 4 bits only",
                          param="model.path")
    if str(quant.get("version", "gemm")).lower() != "gemm":
        raise ConfigError(f"{where}.version={quant.get('version')}: only AWQ's GEMM layout loads (version gemm)",
                          param="model.path")
    if quant.get("zero_point", True) is not True:
        raise ConfigError(f"{where}.zero_point={quant.get('zero_point')}: only AWQ with zero points loads",
                          param="model.path")
    group, allowed = quant.get("group_size"), quantization_group_sizes()
    if group not in allowed:
        raise ConfigError(f"{where}.group_size={group}: int4 takes groups of {', '.join(map(str, allowed))}",
                          param="model.path")
    return AwqFormat(group)


def settle_quantization(cfg: EngineConfig, path: str) -> EngineConfig:
    """`cfg` with engine.quantization settled for the checkpoint at `path`: an AWQ checkpoint runs int4 in
    its own groups (engine.quantization auto or int4; anything else is refused), any other checkpoint
    runs `auto` unquantized."""
    fmt = awq_format(path)
    if fmt is None:
        return replace(cfg, quantization=Quantization.none) if cfg.quantization is Quantization.auto else cfg
    if cfg.quantization not in (Quantization.auto, Quantization.int4):
        raise ConfigError(f"engine.quantization={cfg.quantization.value} conflicts with {path}, an AWQ "
                          f"checkpoint (4-bit): it runs int4; use engine.quantization=int4 or auto",
                          param="engine.quantization")
    return replace(cfg, quantization=Quantization.int4, quantization_group_size=fmt.group_size)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, C] of AWQ-packed nibbles -> their values, int32 [R, 8C] in column order."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    nibbles = (packed[..., None] >> shifts) & 0xF  # [R, C, 8]: nibble j of each int32
    values = torch.empty_like(nibbles)
    values[..., list(PACK_ORDER)] = nibbles
    return values.reshape(packed.shape[0], -1)


def int4_groups(name: str, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                group_size: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Layer `name`'s (q [N, K], scale [N, K/G], zero [N, K/G]) in torch's int4 convention, fp32 (exact)."""
    k, n = qweight.shape[0], qweight.shape[1] * 8
    expected = {"qweight": (k, n // 8), "qzeros": (k // group_size, n // 8), "scales": (k // group_size, n)}
    for part, tensor in zip(PARTS, (qweight, qzeros, scales)):
        if tuple(tensor.shape) != expected[part] or k % group_size:
            raise ValueError(f"{name}.{part} has shape {tuple(tensor.shape)}; AWQ in groups of {group_size} "
                             f"with qweight {tuple(qweight.shape)} needs {expected[part]}")
    scale = scales.float()
    zero = (MIDPOINT - unpack(qzeros)) * scale
    return unpack(qweight).t(), scale.t(), zero.t()


def linear_tensors(weights: Iterable[Tuple[str, torch.Tensor]], group_size: int
                   ) -> Iterator[Tuple[str, torch.Tensor]]:
    """A checkpoint's (name, tensor) pairs with each AWQ layer's qweight, qzeros and scales replaced, once
    all three are read, by `X.weight`, `X.group_scales` and `X.group_zeros` (int4_groups); the rest as
    they come. ValueError naming a layer that lacks one of its parts."""
    pending: Dict[str, Dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        layer, _, part = name.rpartition(".")
        if part not in PARTS:
            yield name, tensor
            continue
        parts = pending.setdefault(layer, {})
        parts[part] = tensor
        if len(parts) == len(PARTS):
            del pending[layer]
            q, scale, zero = int4_groups(layer, parts["qweight"], parts["qzeros"], parts["scales"], group_size)
            yield f"{layer}.weight", q
            yield f"{layer}.group_scales", scale
            yield f"{layer}.group_zeros", zero
    for layer, parts in pending.items():
        missing = [p for p in PARTS if p not in parts]
        raise ValueError(f"AWQ layer {layer} lacks {', '.join(missing)} in the checkpoint")


def projection_shape(name: str, shape) -> Optional[Tuple[str, Tuple[int, int]]]:
    """(`X.weight`, its [N, K]) for an AWQ layer's `X.qweight` [K, N/8] (what it loads as); None otherwise."""
    layer, _, part = name.rpartition(".")
    if part != "qweight" or len(shape) != 2:
        return None
    return f"{layer}.weight", (int(shape[1]) * 8, int(shape[0]))
