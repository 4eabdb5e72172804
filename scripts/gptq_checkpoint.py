"""Write a checkpoint in GPTQ's layout (4-bit, as AutoGPTQ and GPTQModel publish them) from an HF
directory: the language model's projections quantised per group by GPTQ's formula, every other tensor
as it is.

    python scripts/gptq_checkpoint.py OUT [--source DIR] [--group-size 128] [--sym] [--v2] [--zero-bias]
        [--keep LAYER ...]

The quantiser is plain rounding (GPTQ's error feedback is left out: the layout is the point, for the
loader's tests), groups in input order (desc_act false), per group of G inputs of an output column:
asymmetric s = (max - min) / 15 (fp16), z = round(-min / s); symmetric (--sym) s = 2 · max|w| / 15,
z = 8; q = round(w / s) + z, all clamped to 0..15, so w ≈ (q - z) · s. Stored transposed from nn.Linear's
[out, in]: qweight int32 [in/8, out] (nibble j of row i is input 8i + j), qzeros int32 [in/G, out/8]
(nibble j of column c is output 8c + j), scales fp16 [in/G, out], g_idx int32 [in] = input // G. The
common format stores z - 1 (so z is kept in 1..15: AutoGPTQ cannot store 0); --v2 writes
checkpoint_format gptq_v2, which stores z. `--zero-bias` writes an all-zero `bias` fp16 [out] beside each
quantised layer, as AutoGPTQ's exports do for layers without one. `--keep` layers
(e.g. language_model.model.layers.1.mlp.down_proj) stay plain, as a GPTQ writer told to skip them leaves them.
Needs the appliance package importable (installed, or PYTHONPATH at the repository).
"""
import argparse
from pathlib import Path
from typing import Sequence

import torch

from quantized_copy import write_quantized_copy

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = REPO / "appliance" / "assets" / "models" / "llava_tiny"


def quantize(weight: torch.Tensor, group_size: int, sym: bool, lowest_zero: int):
    """(q int32 [in, out], z int32 [in/G, out], s fp16 [in/G, out]) of an nn.Linear weight [out, in]."""
    w = weight.float().t()  # [in, out]
    k, n = w.shape
    groups = w.reshape(k // group_size, group_size, n)
    low, high = groups.amin(dim=1), groups.amax(dim=1)
    if sym:
        s = (2 * torch.maximum(low.abs(), high.abs()).clamp_min(1e-5) / 15).half()
        z = torch.full_like(low, 8)
    else:
        s = ((high - low).clamp_min(1e-5) / 15).half()
        z = torch.round(-low / s.float()).clamp(lowest_zero, 15)
    q = (torch.round(groups / s.float()[:, None]) + z[:, None]).clamp(0, 15)
    return q.reshape(k, n).to(torch.int32), z.to(torch.int32), s


def pack_rows(values: torch.Tensor) -> torch.Tensor:
    """int32 [R, C] of 4-bit values -> int32 [R/8, C], row 8i + j in nibble j of row i."""
    rows = values.reshape(-1, 8, values.shape[1])
    packed = torch.zeros(rows.shape[0], rows.shape[2], dtype=torch.int32)
    for j in range(8):
        packed |= rows[:, j] << (4 * j)  # int32 shifts wrap: the top nibble sets the sign bit
    return packed


def pack_columns(values: torch.Tensor) -> torch.Tensor:
    """int32 [R, C] of 4-bit values -> int32 [R, C/8], column 8c + j in nibble j of column c."""
    return pack_rows(values.t().contiguous()).t().contiguous()


def write_gptq_checkpoint(out: Path, source: Path = DEFAULT_SOURCE, group_size: int = 128, sym: bool = False,
                          v2: bool = False, keep: Sequence[str] = (), zero_bias: bool = False) -> Path:
    """`source`'s files in `out` with its language model's projections (but `keep`) in GPTQ's layout, with
    an all-zero bias each if `zero_bias`; returns `out`."""
    def layer_parts(weight: torch.Tensor) -> dict:
        q, z, s = quantize(weight, group_size, sym, lowest_zero=0 if v2 else 1)
        parts = {"qweight": pack_rows(q), "qzeros": pack_columns(z if v2 else z - 1), "scales": s,
                 "g_idx": torch.arange(q.shape[0], dtype=torch.int32) // group_size}
        if zero_bias:
            parts["bias"] = torch.zeros(weight.shape[0], dtype=torch.float16)
        return parts

    config = {"quant_method": "gptq", "bits": 4, "group_size": group_size, "desc_act": False, "sym": sym,
              "checkpoint_format": "gptq_v2" if v2 else "gptq"}
    return write_quantized_copy(out, source, keep, layer_parts, config)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--sym", action="store_true", help="symmetric groups (zero 8)")
    parser.add_argument("--v2", action="store_true", help="checkpoint_format gptq_v2 (zeros stored as they are)")
    parser.add_argument("--zero-bias", action="store_true", help="an all-zero bias beside each quantised layer")
    parser.add_argument("--keep", nargs="*", default=[], help="layers left plain")
    args = parser.parse_args(argv)
    print(write_gptq_checkpoint(args.out, args.source, args.group_size, args.sym, args.v2, args.keep,
                                args.zero_bias))


if __name__ == "__main__":
    main()
