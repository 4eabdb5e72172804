"""Checkpoints quantised to 4 bits before we load them (AWQ: awq.py, GPTQ: gptq.py), read as int4
weights: the one place that decides a checkpoint's format, from config.json's `quantization_config`.

At load each quantised layer's parts (qweight, qzeros, scales, ...) become nn.Linear-shaped tensors in
torch's int4 convention (w = (q - 8) · scale + zero): `X.weight` = q [N, K], `X.group_scales` and
`X.group_zeros` [N, K/G], by the format's own formula. The projections' weight loaders fuse and shard
them as any weight (linear.add_int4_groups), and `quantize_projections` packs them as they are: nothing
is quantised again. A decoder projection the checkpoint left plain (AWQ's `modules_to_not_convert`, a
GPTQ writer's skipped layers) is quantised here in the checkpoint's groups, as engine.quantization=int4
quantises any weight (int4.quantize_groups), so every projection runs int4 in one group size.
AutoGPTQ's exports store an `X.bias` beside every quantised layer, all zeros where the model has none:
such a bias is dropped; one that is not all zeros, where the model's layer has no bias, is refused.
"""
import json
import os
from dataclasses import replace
from typing import Callable, Dict, Iterable, Iterator, Optional, Protocol, Sequence, Tuple

import torch

from appliance.engine.awq import awq_format
from appliance.engine.config import EngineConfig, Quantization, quantization_group_sizes
from appliance.engine.decoder_projections import BIAS_FLAGS, biased_projection, has_bias, is_decoder_projection
from appliance.engine.gptq import gptq_format
from appliance.engine.int4 import quantize_groups
from appliance.engine.safetensors_files import iter_weights
from appliance.errors import ConfigError

BITS = 4  # what int4 holds; any other bit width is refused


class QuantizedFormat(Protocol):
    """One pre-quantised format's layout: its layers' part names and formula."""

    @property
    def name(self) -> str: ...  # "AWQ", "GPTQ"

    @property
    def group_size(self) -> int: ...  # inputs sharing a scale and a zero

    @property
    def parts(self) -> Tuple[str, ...]: ...  # a quantised layer's tensors, `qweight` first

    def dense_shape(self, qweight_shape: Sequence[int]) -> Tuple[int, int]: ...

    def check_layers(self, path: str) -> None: ...  # ConfigError for a layer the config alone does not show

    def int4_groups(self, layer: str, parts: Dict[str, torch.Tensor]
                    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


# quant_method -> its format's config reader (the quantization_config, where it is, its group size)
READERS: Dict[str, Callable[[dict, str, int], QuantizedFormat]] = {"awq": awq_format, "gptq": gptq_format}


def checkpoint_format(quant: Optional[dict], path: str) -> Optional[QuantizedFormat]:
    """The format that `quant`, the quantization_config of `path`'s config.json, declares (None: an
    unquantised checkpoint); ConfigError naming the field this engine cannot load."""
    if not quant:
        return None
    where = f"{path}/config.json quantization_config"
    method = str(quant.get("quant_method", "")).lower()
    if method not in READERS:
        raise ConfigError(f"{where}.quant_method={quant.get('quant_method')}: only {' and '.join(READERS)} "
                          f"checkpoints load quantised", param="model.path")
    name = method.upper()
    if quant.get("bits") != BITS:
        raise ConfigError(f"{where}.bits={quant.get('bits')}: {name} checkpoints load with {BITS} bits only",
                          param="model.path")
    group, allowed = quant.get("group_size"), quantization_group_sizes()
    if group not in allowed:
        raise ConfigError(f"{where}.group_size={group}: int4 takes groups of {', '.join(map(str, allowed))}",
                          param="model.path")
    return READERS[method](quant, where, group)


def read_config_json(path: str) -> dict:
    """The checkpoint directory `path`'s config.json, parsed ({} where there is none to read)."""
    try:
        with open(os.path.join(path, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def declared_format(path: str, config: Optional[dict] = None) -> Optional[QuantizedFormat]:
    """checkpoint_format of the checkpoint directory `path`, from its config.json (`config`: read already)."""
    config = read_config_json(path) if config is None else config
    return checkpoint_format(config.get("quantization_config"), path)


def quantized_format(hf_config, path: str) -> Optional[QuantizedFormat]:
    """checkpoint_format of the checkpoint at `path` from its config, read already (transformers keeps
    config.json's quantization_config as it is)."""
    return checkpoint_format(getattr(hf_config, "quantization_config", None), path)


def a_checkpoint(fmt: QuantizedFormat) -> str:
    """The format as refusals name it: "an AWQ checkpoint", "a GPTQ checkpoint"."""
    return f"{'an' if fmt.name[0] in 'AEIOU' else 'a'} {fmt.name} checkpoint"


def settle_quantization(cfg: EngineConfig, fmt: Optional[QuantizedFormat], path: str) -> EngineConfig:
    """`cfg` with engine.quantization settled for the checkpoint at `path`, of format `fmt`: a quantised
    checkpoint runs int4 in its own groups (engine.quantization auto or int4; anything else is refused),
    any other checkpoint runs `auto` unquantized."""
    if fmt is None:
        return replace(cfg, quantization=Quantization.none) if cfg.quantization is Quantization.auto else cfg
    if cfg.quantization not in (Quantization.auto, Quantization.int4):
        raise ConfigError(f"engine.quantization={cfg.quantization.value} conflicts with {path}, "
                          f"{a_checkpoint(fmt)} ({BITS}-bit): it runs int4; use engine.quantization=int4 or auto",
                          param="engine.quantization")
    return replace(cfg, quantization=Quantization.int4, quantization_group_size=fmt.group_size)


def linear_tensors(weights: Iterable[Tuple[str, torch.Tensor]], fmt: QuantizedFormat, dtype: torch.dtype,
                   text_config, path: str) -> Iterator[Tuple[str, torch.Tensor]]:
    """A checkpoint's (name, tensor) pairs with each quantised layer's parts replaced, once all are read,
    by `X.weight`, `X.group_scales` and `X.group_zeros` (the format's int4_groups), and each plain decoder
    projection's weight by the same three, quantised in the format's groups with scales and zeros
    rounded to `dtype` (the int4 kernel's); a zero bias of a projection the decoder (`text_config`) has
    none for dropped (unused_bias); the rest as they come. ValueError naming a layer that lacks one of
    its parts."""
    pending: Dict[str, Dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        if unused_bias(name, tensor, text_config, fmt, path):
            continue
        layer, _, part = name.rpartition(".")
        if part in fmt.parts:
            parts = pending.setdefault(layer, {})
            parts[part] = tensor
            if len(parts) < len(fmt.parts):
                continue
            del pending[layer]
            q, scale, zero = fmt.int4_groups(layer, parts)
        elif is_decoder_projection(name):
            q, scale, zero = quantize_groups(tensor.float(), fmt.group_size, dtype)
        else:
            yield name, tensor
            continue
        yield f"{layer}.weight", q
        yield f"{layer}.group_scales", scale
        yield f"{layer}.group_zeros", zero
    for layer, parts in pending.items():
        missing = [p for p in fmt.parts if p not in parts]
        raise ValueError(f"{fmt.name} layer {layer} lacks {', '.join(missing)} in the checkpoint")


def unused_bias(name: str, tensor: torch.Tensor, text_config, fmt: QuantizedFormat, path: str) -> bool:
    """Whether checkpoint tensor `name` of `path` is the bias of a projection the decoder (`text_config`)
    has no bias for, all zeros: nothing to load. ConfigError naming it where it is not all zeros."""
    projection = biased_projection(name)
    if projection is None or has_bias(text_config, projection):
        return False
    if torch.count_nonzero(tensor):
        raise ConfigError(f"{path}: {name} is not all zeros, but the model's {projection} has no bias "
                          f"({BIAS_FLAGS[projection]} is false); {a_checkpoint(fmt)} loads a projection's "
                          f"bias only where the model has one", param="model.path")
    return True


def check_biases(path: str, fmt: QuantizedFormat, text_config) -> None:
    """unused_bias's ConfigError for the checkpoint at `path`, read from its projections' biases alone."""
    for name, tensor in iter_weights(path, keep=lambda name: biased_projection(name) is not None):
        unused_bias(name, tensor, text_config, fmt, path)


def dense_projection(fmt: QuantizedFormat, name: str, shape: Sequence[int]) -> Optional[Tuple[str, Tuple[int, int]]]:
    """(`X.weight`, its [N, K]) for a quantised layer's `X.qweight` (what it loads as); None otherwise."""
    layer, _, part = name.rpartition(".")
    if part != fmt.parts[0] or len(shape) != 2:
        return None
    return f"{layer}.weight", fmt.dense_shape(shape)
