"""Read a torch checkpoint file (`.pt`, `.pth`, `.ckpt`, `.bin`) safely: tensors and plain values only.

Training frameworks leave metadata beside the weights; mmcv's (the Prithvi-EO-1.0 fine-tunes) holds numpy
scalars (an EvalHook's best score), which `weights_only` refuses by default. They are allowed here, as
they build plain values; anything else that is not a tensor, container or plain value is refused.
"""
import pickle
from typing import Any, Callable, List, Optional, Tuple, Union

import numpy as np
import torch

from appliance.errors import ConfigError

# How numpy's scalar constructor is named in pickles made with numpy 1.x and 2.x.
NUMPY_SCALAR_NAMES = ("numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar")


def load_torch_file(path: str, mmap: bool = False):
    """torch.load(weights_only=True) of `path`, numpy scalars allowed; a ConfigError when it cannot."""
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        except pickle.UnpicklingError:
            allowed = numpy_scalar_globals(torch.serialization.get_unsafe_globals_in_checkpoint(path))
            if allowed is None:
                raise
            with torch.serialization.safe_globals(allowed):
                return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # pickle and zip errors come in many types
        raise ConfigError(
            f"cannot read {path!r} with torch.load(weights_only=True): {exc}. Only tensors and plain values are "
            "read from checkpoints; re-save it as a plain state dict, e.g. torch.save(torch.load(p)['state_dict'], q)"
        ) from exc


def numpy_scalar_globals(names: List[str]) -> Optional[list]:
    """The allow-list entries for `names` when every one is numpy's scalar constructor or a numeric dtype
    (they build plain values), else None."""
    allowed: List[Union[Callable[..., Any], Tuple[Callable[..., Any], str]]] = []
    for name in names:
        if name in NUMPY_SCALAR_NAMES:
            scalar = np.float64(0).__reduce__()[0]  # numpy's scalar constructor, as pickle finds it
            allowed.append((scalar, name))
        elif name == "numpy.dtype":
            # Unpickling a dtype also builds its class (numpy.dtypes.Float64DType, ...): the numeric ones.
            codes = "?" + np.typecodes["AllInteger"] + np.typecodes["AllFloat"]
            allowed += [np.dtype, *{type(np.dtype(code)) for code in codes}]
        else:
            return None
    return allowed
