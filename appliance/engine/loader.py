"""Load HF safetensors checkpoints (single file or sharded index) into our fused, sharded params.

Tensors come from `iter_weights` (safetensors_files.py): views of the memory-mapped file, each copied
by its parameter's weight loader (a tensor-parallel rank copies only its shard's rows or columns) and
its pages released right after, so loading writes the weights once and the process never holds more
than the parameters plus one tensor's file pages.
"""
from typing import Callable, Iterable, Optional, Tuple

import torch
from torch import nn

from appliance.engine.linear import WEIGHT_LOADER, default_weight_loader
from appliance.engine.safetensors_files import iter_weights


def load_weights(model: nn.Module, path: str) -> None:
    """Copy every checkpoint tensor in `path` into its parameter."""
    tied = getattr(model, "tie_word_embeddings", False)

    def skip(name: str) -> bool:
        return "rotary_emb.inv_freq" in name or (tied and name == "lm_head.weight")

    load_named_weights(model, iter_weights(path), skip, source=path)


def load_named_weights(model: nn.Module, weights: Iterable[Tuple[Optional[str], torch.Tensor]],
                       skip: Callable[[str], bool] = lambda name: False, fuse_under: str = "",
                       source: str = "checkpoint") -> None:
    """Copy (name, tensor) pairs into parameters through each parameter's weight_loader.

    Names mapped to None and names `skip` accepts are dropped; q/k/v and gate/up are fused per
    `packed_modules_mapping` only for names under `fuse_under` (a CLIP tower keeps its own q/k/v).
    """
    params = dict(model.named_parameters())
    mapping = getattr(model, "packed_modules_mapping", {})
    loaded = set()
    for name, tensor in weights:
        if name is None or skip(name):
            continue
        shard_id = None
        if name.startswith(fuse_under):
            for src, (dst, sid) in mapping.items():
                if f".{src}." in name:
                    name, shard_id = name.replace(f".{src}.", f".{dst}."), sid
                    break
        if name not in params:
            raise KeyError(f"checkpoint tensor {name!r} has no matching model parameter; is the "
                           f"architecture in config.json right for this checkpoint?")
        param = params[name]
        loader = getattr(param, WEIGHT_LOADER, None)
        with torch.no_grad():
            if loader is None:
                default_weight_loader(param, tensor)
            elif shard_id is None:
                loader(param, tensor)
            else:
                loader(param, tensor, shard_id)
        loaded.add(name)
    missing = {n for n in params if n not in loaded and not skip(n)}
    if missing:
        raise KeyError(f"{source} lacks parameters: {sorted(missing)[:8]}")
