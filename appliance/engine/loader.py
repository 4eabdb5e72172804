"""Load HF safetensors checkpoints (single file or sharded index) into our fused, sharded params."""
import json
import os
from typing import Iterator, List, Tuple

import torch
from safetensors import safe_open
from torch import nn

from appliance.engine.linear import default_weight_loader


def checkpoint_files(path: str) -> List[str]:
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(path, n) for n in names]
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}; save the model with "
                                f"save_pretrained(..., safe_serialization=True)")
    return [os.path.join(path, f) for f in files]


def iter_weights(path: str) -> Iterator[Tuple[str, torch.Tensor]]:
    for file in checkpoint_files(path):
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def load_weights(model: nn.Module, path: str) -> None:
    """Copy every checkpoint tensor into its parameter through the parameter's weight_loader."""
    params = dict(model.named_parameters())
    mapping = getattr(model, "packed_modules_mapping", {})
    tied = getattr(model, "tie_word_embeddings", False)
    loaded = set()
    for name, tensor in iter_weights(path):
        if "rotary_emb.inv_freq" in name or (tied and name == "lm_head.weight"):
            continue
        shard_id = None
        for src, (dst, sid) in mapping.items():
            if f".{src}." in name:
                name, shard_id = name.replace(f".{src}.", f".{dst}."), sid
                break
        if name not in params:
            raise KeyError(f"checkpoint tensor {name!r} has no matching model parameter; is the "
                           f"architecture in config.json right for this checkpoint?")
        param = params[name]
        loader = getattr(param, "weight_loader", None)
        with torch.no_grad():
            if loader is None:
                default_weight_loader(param, tensor)
            elif shard_id is None:
                loader(param, tensor)
            else:
                loader(param, tensor, shard_id)
        loaded.add(name)
    missing = set(params) - loaded - ({"lm_head.weight"} if tied else set())
    if missing:
        raise KeyError(f"checkpoint at {path} lacks parameters: {sorted(missing)[:8]}")
