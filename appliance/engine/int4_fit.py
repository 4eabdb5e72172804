"""Whether a checkpoint's projections can hold int4 weights, read from its safetensors headers before any
weight loads (`appliance check` refuses what the engine would refuse at load: linear.quantize_projections)."""
from typing import Optional, Tuple

from appliance.engine.checkpoint_facts import header_tensors, is_decoder_projection
from appliance.engine.int4 import layer_problem
from appliance.engine.safetensors_files import checkpoint_files, read_header

ROW_PARALLEL = ("o_proj", "down_proj")  # split by input features across ranks; the others by output features


def checkpoint_problem(path: str, group_size: int, tp: int, group_sizes: Tuple[int, ...]) -> Optional[str]:
    """Why the decoder's projections of the HF checkpoint at `path` cannot be int4 in groups of
    `group_size` on `tp` ranks (None: they can, or the headers cannot be read here)."""
    try:
        headers = [read_header(file)[1] for file in checkpoint_files(path)]
    except (OSError, ValueError):  # reported where the weights are read
        return None
    for header in headers:
        for name, _, shape in sorted(header_tensors(header)):
            if not is_decoder_projection(name) or len(shape) != 2:
                continue
            n, k = shape
            row = name.split(".")[-2] in ROW_PARALLEL
            problem = layer_problem(name.rsplit(".", 1)[0], n if row else n // tp, k // tp if row else k,
                                    group_size, group_sizes)
            if problem:
                return problem
    return None
