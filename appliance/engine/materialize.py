"""Models built without touching memory, then given storage in their final dtype, uninitialised.

A model is built under `torch.device("meta")` (`build_on_meta`): its modules run their constructors,
random initialisation included, on tensors without storage, which costs nothing. `materialize` then
gives every parameter empty storage on the target device in the target dtype (floating ones; others
keep theirs), and the checkpoint loader fills it: one write per weight, no full-precision model first,
no conversion pass after. At 7B that removes the fp32 build and `module.to(dtype)` (a pass over every
weight, and twice the weights' memory). On CPU a large parameter gets huge pages (a decode step streams them all).

Buffers are computed, not loaded (rotary tables, position ids): a module that owns such buffers
defines `init_buffers()` (it or a module above it), which `materialize` calls once their storage
exists. A meta buffer that no such module covers is a model bug, reported by name before anything is
allocated.
"""
from typing import Callable, Dict, TypeVar

import torch
from torch import nn

from appliance.engine import hugepages

ModuleT = TypeVar("ModuleT", bound=nn.Module)


def build_on_meta(build: Callable[[], ModuleT]) -> ModuleT:
    """`build()` with every tensor it makes on the meta device (no memory, no initialisation)."""
    with torch.device("meta"):
        return build()


def materialize(model: ModuleT, device: torch.device, dtype: torch.dtype) -> ModuleT:
    """Give `model`'s meta parameters and buffers uninitialised storage on `device` (floating point ones
    in `dtype`), then run each module's `init_buffers()`. Tied parameters stay tied; attributes set on
    a parameter (its `weight_loader`) carry over. Returns the model."""
    device = torch.device(device)
    _check_buffers_are_computed(model)
    made: Dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if not param.is_meta:
                continue
            if id(param) not in made:
                new = nn.Parameter(_empty(param, device, dtype), requires_grad=param.requires_grad)
                new.__dict__.update(param.__dict__)
                made[id(param)] = new
            setattr(module, name, made[id(param)])
        for name, buf in list(module.named_buffers(recurse=False)):
            if buf is not None and buf.is_meta:
                setattr(module, name, _empty(buf, device, dtype))
    for module in model.modules():
        init = getattr(module, "init_buffers", None)
        if callable(init):
            init()
    return model


def _check_buffers_are_computed(model: nn.Module) -> None:
    """Every meta buffer must belong to a module that (or an ancestor of which) has init_buffers():
    a buffer nobody computes would be used uninitialised."""
    owners = [name for name, m in model.named_modules() if callable(getattr(m, "init_buffers", None))]
    orphans = [name for name, buf in model.named_buffers() if buf.is_meta and not any(
        owner == "" or name.startswith(owner + ".") for owner in owners)]
    if orphans:
        raise RuntimeError(f"{type(model).__name__}: buffers {orphans[:8]} were built on the meta device "
                           f"but no module computes them; the module that owns them needs an init_buffers()")


def _empty(like: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    dtype = dtype if like.is_floating_point() else like.dtype
    if device.type == "cpu":
        return hugepages.empty(tuple(like.shape), dtype)
    return torch.empty(tuple(like.shape), dtype=dtype, device=device)
