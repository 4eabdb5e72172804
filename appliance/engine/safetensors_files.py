"""Safetensors files read without a library: the file list of a checkpoint directory, a file's tensor
table, and its tensors as views of the memory-mapped file whose pages leave the process once used.

Why not safetensors' own reader: it keeps every page a file's tensors touched mapped into the process
until the file is closed, so loading a 7B model held a 5 GB shard on top of the weights. The format is
8 bytes of little-endian header length, a JSON table {name: {dtype, shape, data_offsets}}, the data.
"""
import json
import mmap
import os
import struct
from typing import Callable, Dict, Iterator, List, Tuple

import torch

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


SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}


def read_header(file: str) -> Tuple[int, Dict[str, dict]]:
    """(offset of the data, {name: {"dtype", "shape", "data_offsets"}}) of a safetensors file: its
    8-byte little-endian header length, then the JSON header. Reads nothing else."""
    with open(file, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return 8 + size, header


def iter_weights(path: str, keep: Callable[[str], bool] = lambda name: True
                 ) -> Iterator[Tuple[str, torch.Tensor]]:
    """(name, tensor) of every checkpoint tensor whose name `keep` accepts; the others are not read.
    A tensor is a read-only view of the mapped file: copy from it before taking the next one (its
    pages leave this process's memory then; reading it later reads the file again)."""
    for file in checkpoint_files(path):
        start, header = read_header(file)
        with open(file, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # private: never written back
        # Never closed here: each tensor holds the mapping, which is unmapped when the last one goes.
        for name, info in header.items():
            if keep(name):
                lo, hi = (start + o for o in info["data_offsets"])
                yield name, _view(mapped, lo, hi, info, file, name)
                _release(mapped, lo, hi)


def _view(mapped: mmap.mmap, lo: int, hi: int, info: dict, file: str, name: str) -> torch.Tensor:
    dtype = SAFETENSORS_DTYPES.get(info["dtype"])
    if dtype is None:
        raise ValueError(f"{file}: tensor {name!r} has dtype {info['dtype']}, which the engine does not "
                         f"read (supported: {', '.join(SAFETENSORS_DTYPES)})")
    shape = info["shape"]
    if hi == lo:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(mapped, dtype=dtype, count=(hi - lo) // dtype.itemsize, offset=lo).view(shape)


def _release(mapped: mmap.mmap, lo: int, hi: int) -> None:
    """Drop the whole pages of [lo, hi) from this process (the page cache keeps them)."""
    first, last = -(-lo // mmap.PAGESIZE) * mmap.PAGESIZE, hi // mmap.PAGESIZE * mmap.PAGESIZE
    if last > first:
        mapped.madvise(mmap.MADV_DONTNEED, first, last - first)
