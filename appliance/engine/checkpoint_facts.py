"""What a checkpoint holds, read without loading it: its own dtype and how many weights it has.

An HF directory: the dtype config.json declares (`dtype`, transformers 4's `torch_dtype`, or its
`text_config`'s), else the dtype most of its tensors have; sizes from the safetensors headers.
A single file (terratorch `.pt`/`.ckpt`, our `.safetensors`): the dtype of most of its floating point
weights (a `.pt` is memory-mapped, its tensors are not read).
"""
import math
from collections import Counter
from dataclasses import dataclass
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

import torch

from appliance.engine.decoder_projections import is_decoder_projection
from appliance.engine.quantized_checkpoint import QuantizedFormat, declared_format, dense_projection, read_config_json
from appliance.engine.safetensors_files import SAFETENSORS_DTYPES, checkpoint_files, read_header
from appliance.engine.torch_files import load_torch_file
from appliance.errors import ConfigError


def header_tensors(header: Dict[str, dict], fmt: Optional[QuantizedFormat] = None
                   ) -> Iterator[Tuple[str, Optional[torch.dtype], List[int]]]:
    """(name, dtype, shape) of a safetensors header's tensors as the engine loads them: a layer of a
    checkpoint quantised as `fmt` (qweight, qzeros, scales, ...) as the one weight `X.weight` [out, in]
    it loads as, before it is packed (quantized_checkpoint.py; counted in fp16, the formats' own dtype)."""
    for name, tensor in header.items():
        if fmt is None:
            yield name, SAFETENSORS_DTYPES.get(tensor["dtype"]), tensor["shape"]
            continue
        layer, _, part = name.rpartition(".")
        dense = dense_projection(fmt, name, tensor["shape"])
        if dense is not None:
            yield dense[0], torch.float16, list(dense[1])
        elif part not in fmt.parts or f"{layer}.{fmt.parts[0]}" not in header:
            yield name, SAFETENSORS_DTYPES.get(tensor["dtype"]), tensor["shape"]


@dataclass(frozen=True)
class CheckpointFacts:
    dtype: torch.dtype  # the checkpoint's own floating point dtype
    float_elements: int  # elements of its floating point tensors: the weights a dtype applies to
    other_bytes: int = 0  # integer tensors (kept as they are)
    projection_elements: int = 0  # of float_elements, those of the decoder's projections (int8 candidates)

    def weight_bytes(self, dtype: torch.dtype, int8: bool = False, int4_group: Optional[int] = None) -> int:
        """The weights' memory in `dtype`, the decoder's projections as int8 bytes when `int8` (an upper
        bound: tensors the engine skips are counted; int8's per-row scales are left out, ~0.1 %), or as
        int4 in groups of `int4_group` when given: half a byte a weight, and a scale and a zero a group
        (int4.Int4Weight; counted as fp32, the widest they are stored in)."""
        if int4_group is not None:
            projections = self.projection_elements
            quantized = math.ceil(projections / 2 + projections / int4_group * 2 * 4)
        else:
            projections = self.projection_elements if int8 else 0
            quantized = projections
        return (self.float_elements - projections) * dtype.itemsize + quantized + self.other_bytes


def hf_checkpoint_facts(path: str) -> CheckpointFacts:
    """Facts of an HF model directory (config.json and its safetensors)."""
    tensors, projections = [], 0
    config = read_config_json(path)
    fmt = declared_format(path, config)
    for file in checkpoint_files(path):
        _, header = read_header(file)
        for name, dtype, shape in header_tensors(header, fmt):
            tensors.append((dtype, shape))
            projections += math.prod(shape) if is_decoder_projection(name) else 0
    facts = _facts(tensors, path)
    return CheckpointFacts(declared_dtype(config) or facts.dtype, facts.float_elements, facts.other_bytes,
                           projections)


def file_checkpoint_facts(file: str) -> CheckpointFacts:
    """Facts of a single checkpoint file (.safetensors, or a torch .pt/.pth/.ckpt state dict)."""
    if file.endswith(".safetensors"):
        _, header = read_header(file)
        return _facts([(SAFETENSORS_DTYPES.get(t["dtype"]), t["shape"]) for t in header.values()], file)
    state = load_torch_file(file, mmap=True)
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    tensors = state.values() if isinstance(state, dict) else []
    return _facts([(t.dtype, t.shape) for t in tensors if isinstance(t, torch.Tensor)], file)


def model_checkpoint_facts(model_cfg) -> CheckpointFacts:
    """Facts of a config's model: `model.checkpoint` (a file) or else `model.path` (an HF directory)."""
    checkpoint = getattr(model_cfg, "checkpoint", None)
    return file_checkpoint_facts(str(checkpoint)) if checkpoint else hf_checkpoint_facts(str(model_cfg.path))


def declared_dtype(config: dict) -> Optional[torch.dtype]:
    """The dtype a parsed config.json declares for the weights, if any."""
    for node in (config, config.get("text_config") or {}):
        name = node.get("dtype") or node.get("torch_dtype")
        dtype = getattr(torch, name, None) if isinstance(name, str) else None
        if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
            return dtype
    return None


def _facts(tensors: Iterable[Tuple[Optional[torch.dtype], Iterable[int]]], source: str) -> CheckpointFacts:
    elements: Dict[torch.dtype, int] = Counter()
    other = 0
    for dtype, shape in tensors:
        n = 1
        for d in shape:
            n *= int(d)
        if dtype is not None and dtype.is_floating_point:
            elements[dtype] += n
        elif dtype is not None:
            other += n * dtype.itemsize
    if not elements:
        raise ConfigError(f"{source} holds no floating point weights: not a model checkpoint")
    return CheckpointFacts(max(elements, key=lambda dtype: elements[dtype]), sum(elements.values()), other)
