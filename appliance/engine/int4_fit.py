"""Whether a checkpoint's projections can hold int4 weights, read from its safetensors headers before any
weight loads (`appliance check` refuses what the engine would refuse at load: linear.quantize_projections):
in engine.quantization_group_size (`checkpoint_problem`), or, for a checkpoint quantised already, in its
own groups on the ranks they are split across (`split_problem`)."""
from typing import Iterator, Optional, Tuple

from appliance.engine.checkpoint_facts import header_tensors
from appliance.engine.decoder_projections import is_decoder_projection
from appliance.engine.int4 import N_MULTIPLE, layer_problem
from appliance.engine.quantized_checkpoint import QuantizedFormat
from appliance.engine.safetensors_files import checkpoint_files, read_header

ROW_PARALLEL = ("o_proj", "down_proj")  # split by input features across ranks; the others by output features


def rank_shapes(path: str, tp: int, fmt: Optional[QuantizedFormat]) -> Iterator[Tuple[str, int, int]]:
    """(layer, output features, input features) of each decoder projection of the HF checkpoint at `path`
    on one of `tp` ranks; OSError or ValueError where the headers cannot be read."""
    headers = [read_header(file)[1] for file in checkpoint_files(path)]
    for header in headers:
        for name, _, shape in sorted(header_tensors(header, fmt)):
            if not is_decoder_projection(name) or len(shape) != 2:
                continue
            n, k = shape
            row = name.split(".")[-2] in ROW_PARALLEL
            yield name.rsplit(".", 1)[0], n if row else n // tp, k // tp if row else k


def checkpoint_problem(path: str, group_size: int, tp: int, group_sizes: Tuple[int, ...]) -> Optional[str]:
    """Why the decoder's projections of the HF checkpoint at `path` cannot be int4 in groups of
    `group_size` on `tp` ranks (None: they can, or the headers cannot be read here)."""
    try:
        for layer, n, k in rank_shapes(path, tp, None):
            problem = layer_problem(layer, n, k, group_size, group_sizes)
            if problem:
                return problem
    except (OSError, ValueError):  # reported where the weights are read
        return None
    return None


def split_problem(path: str, fmt: QuantizedFormat, tp: int) -> Optional[str]:
    """Why the decoder's projections of `path`, quantised as `fmt`, cannot run int4 on `tp` ranks: a rank's
    share of a layer's inputs not whole groups, or its outputs not what torch's int4 kernel packs (None:
    they can, or the headers cannot be read here)."""
    try:
        for layer, n, k in rank_shapes(path, tp, fmt):
            if k % fmt.group_size:
                return f"{layer} has {k} input features per rank, not a multiple of the checkpoint's {fmt.group_size}"
            if n % N_MULTIPLE:
                return (f"{layer} has {n} output features per rank, not a multiple of {N_MULTIPLE} as torch's "
                        f"int4 kernel needs")
    except (OSError, ValueError):  # reported where the weights are read
        return None
    return None
