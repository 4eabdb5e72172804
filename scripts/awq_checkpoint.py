"""Write a checkpoint in AWQ's GEMM layout (4-bit, as AutoAWQ publishes them) from an HF directory: the
language model's projections quantised per group by AWQ's formula, every other tensor as it is.

    python scripts/awq_checkpoint.py OUT [--source DIR] [--group-size 128] [--keep LAYER ...]

The quantiser is the plain asymmetric min/max one (AWQ's scale search is left out: the layout is the
point, for the loader's tests): per group of G inputs of an output column, s = (max - min) / 15 (fp16),
z = round(-min / s) clamped to 0..15, q = round(w / s) + z clamped to 0..15, so w ≈ (q - z) · s. Stored
transposed from nn.Linear's [out, in]: qweight int32 [in, out/8], qzeros int32 [in/G, out/8], scales
fp16 [in/G, out], eight 4-bit values an int32 in AWQ's order (its nibble j holds column PACK_ORDER[j]).
`--keep` layers (e.g. language_model.model.layers.1.mlp.down_proj) stay plain, named in the config's
`modules_to_not_convert` as AutoAWQ names the layers it leaves.
Needs the appliance package importable (installed, or PYTHONPATH at the repository).
"""
import argparse
from pathlib import Path
from typing import Sequence

import torch

from appliance.engine.awq import PACK_ORDER
from quantized_copy import write_quantized_copy

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = REPO / "appliance" / "assets" / "models" / "llava_tiny"


def quantize(weight: torch.Tensor, group_size: int):
    """(q int32 [in, out], z int32 [in/G, out], s fp16 [in/G, out]) of an nn.Linear weight [out, in]."""
    w = weight.float().t()  # [in, out]
    k, n = w.shape
    groups = w.reshape(k // group_size, group_size, n)
    low, high = groups.amin(dim=1), groups.amax(dim=1)
    s = ((high - low).clamp_min(1e-5) / 15).half()
    z = torch.round(-low / s.float()).clamp(0, 15)
    q = (torch.round(groups / s.float()[:, None]) + z[:, None]).clamp(0, 15)
    return q.reshape(k, n).to(torch.int32), z.to(torch.int32), s


def pack(values: torch.Tensor) -> torch.Tensor:
    """int32 [R, C] of 4-bit values -> int32 [R, C/8], AWQ's order."""
    columns = values.reshape(values.shape[0], -1, 8)
    packed = torch.zeros(columns.shape[:2], dtype=torch.int32)
    for j, column in enumerate(PACK_ORDER):
        packed |= columns[..., column] << (4 * j)  # int32 shifts wrap: the top nibble sets the sign bit
    return packed


def write_awq_checkpoint(out: Path, source: Path = DEFAULT_SOURCE, group_size: int = 128,
                         keep: Sequence[str] = ()) -> Path:
    """`source`'s files in `out` with its language model's projections (but `keep`) in AWQ's GEMM layout;
    returns `out`."""
    def layer_parts(weight: torch.Tensor) -> dict:
        q, z, s = quantize(weight, group_size)
        return {"qweight": pack(q), "qzeros": pack(z), "scales": s}

    config = {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True, "version": "gemm"}
    if keep:
        config["modules_to_not_convert"] = list(keep)
    return write_quantized_copy(out, source, keep, layer_parts, config)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--keep", nargs="*", default=[], help="layers left plain")
    args = parser.parse_args(argv)
    print(write_awq_checkpoint(args.out, args.source, args.group_size, args.keep))


if __name__ == "__main__":
    main()
