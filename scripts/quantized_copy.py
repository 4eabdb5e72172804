"""A copy of an HF directory with its language model's projections in a 4-bit layout: what
awq_checkpoint.py and gptq_checkpoint.py share (each says its layout: `layer_parts`)."""
import json
import shutil
from pathlib import Path
from typing import Callable, Dict, Sequence

import torch
from safetensors.torch import load_file, save_file

from appliance.engine.decoder_projections import is_decoder_projection


def write_quantized_copy(out: Path, source: Path, keep: Sequence[str],
                         layer_parts: Callable[[torch.Tensor], Dict[str, torch.Tensor]],
                         quantization_config: dict) -> Path:
    """`source`'s files in `out`: each decoder projection's weight (but the layers in `keep`) replaced by
    the parts `layer_parts` makes of it (`qweight`, ... named without the layer), every other tensor as it
    is, and config.json declaring `quantization_config`; returns `out`."""
    out.mkdir(parents=True, exist_ok=True)
    for file in source.iterdir():
        if file.is_file() and file.suffix != ".safetensors" and file.name != "config.json":
            shutil.copy(file, out / file.name)
    tensors = {}
    for name, tensor in load_file(str(source / "model.safetensors")).items():
        layer = name.rsplit(".", 1)[0]
        if not is_decoder_projection(name) or layer in keep:
            tensors[name] = tensor
            continue
        tensors.update({f"{layer}.{part}": value for part, value in layer_parts(tensor).items()})
    save_file(tensors, str(out / "model.safetensors"))
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out
