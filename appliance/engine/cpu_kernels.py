"""Our AVX2 kernels for fp32 on CPU (csrc/cpu_kernels.c): a GEMM on prepacked weights, paged decode
attention reading K/V in place, and fused small ops (RMSNorm, rotary, KV-cache write, SwiGLU, argmax).

Built on first use with the system C compiler into a per-user cache (keyed by the source's hash) and
loaded with ctypes, so no build step and no torch headers are needed. Where they cannot be built
(no compiler, no AVX2/FMA, not x86-64) `available()` is False, with the reason in `unavailable_reason()`,
and the engine runs on torch's kernels alone.
"""
import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "cpu_kernels.c"
FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC"]

_i64, _ptr, _f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
_SIGNATURES = {
    "pack_weight_f32": [_ptr, _i64, _i64, _ptr],
    "linear_packed_f32": [_ptr, _i64, _ptr, _ptr, _i64, _i64, _i64, _i64],
    "paged_decode_attention_f32": [_ptr, _ptr, _ptr, _ptr, _i64, _ptr, _ptr, _i64, _i64, _i64, _i64, _i64, _f32],
    "rms_norm_f32": [_ptr, _i64, _ptr, _f32, _ptr, _i64, _i64],
    "rotary_f32": [_ptr, _i64, _ptr, _i64, _ptr, _ptr, _ptr, _i64, _i64, _i64, _i64],
    "write_kv_f32": [_ptr, _i64, _ptr, _i64, _ptr, _ptr, _ptr, _i64, _i64],
    "silu_mul_f32": [_ptr, _ptr, _i64, _i64],
    "argmax_rows_f32": [_ptr, _i64, _i64, _ptr],
}

_lib: Optional[ctypes.CDLL] = None
_reason: Optional[str] = None
_loaded = False
_enabled = True  # engine.cpu_kernels; process-wide, like torch's own backend switches


def enable(flag: bool) -> None:
    """Turn our kernels on or off for this process (off: torch's kernels everywhere)."""
    global _enabled
    _enabled = bool(flag)


def _cpu_supports_avx2_fma() -> bool:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text().split("flags", 1)[1].split("\n", 1)[0].split()
    except (OSError, IndexError):
        return False
    return "avx2" in flags and "fma" in flags


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "appliance" / "kernels"


def _build(compiler: str) -> Path:
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join([compiler] + FLAGS).encode()).hexdigest()[:16]
    for directory in (_cache_dir(), Path(tempfile.gettempdir()) / f"appliance-kernels-{os.getuid()}"):
        target = directory / f"cpu_kernels-{key}.so"
        if target.exists():
            return target
        try:
            directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=directory)
            os.close(fd)
        except OSError:
            continue  # read-only cache: try the next place
        try:
            subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", tmp], check=True, capture_output=True,
                           text=True, timeout=120)
            os.replace(tmp, target)  # atomic: concurrent builders never load a half-written file
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return target
    raise OSError(f"no writable directory for the kernel build (tried {_cache_dir()} and the temp dir)")


def _load() -> Optional[ctypes.CDLL]:
    global _lib, _reason, _loaded
    if _loaded:
        return _lib
    _loaded = True
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not _cpu_supports_avx2_fma():
        _reason = "this CPU lacks AVX2/FMA (or is not x86-64)"
    elif compiler is None:
        _reason = "no C compiler (cc/gcc) on PATH"
    else:
        try:
            lib = ctypes.CDLL(str(_build(compiler)))
            for name, argtypes in _SIGNATURES.items():
                getattr(lib, name).argtypes = argtypes
                getattr(lib, name).restype = None
            _lib = lib
        except (OSError, subprocess.SubprocessError) as e:
            detail = getattr(e, "stderr", None) or str(e)
            _reason = f"building {SOURCE.name} failed: {detail.strip()[:500]}"
    if _reason:
        log.warning("CPU kernels unavailable, using torch's: %s", _reason)
    return _lib


def available() -> bool:
    return _enabled and _load() is not None


def unavailable_reason() -> Optional[str]:
    _load()
    return _reason


PANEL = 16  # output columns per packed panel (csrc/cpu_kernels.c)


class PackedWeight:
    """A linear layer's [N, K] fp32 weight repacked for our GEMM: [ceil(N/16), K, 16], zero-padded.
    `out`, if given, is the flat buffer (of `numel(N, K)` floats) to pack into."""

    def __init__(self, weight: torch.Tensor, out: Optional[torch.Tensor] = None):
        if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
            raise ValueError(f"only 2-D fp32 CPU weights pack, got {weight.dtype} {tuple(weight.shape)} "
                             f"on {weight.device}")
        self.out_features, self.in_features = weight.shape
        shape = (-(-self.out_features // PANEL), self.in_features, PANEL)
        self.data = torch.empty(shape, dtype=torch.float32) if out is None else out.view(shape)
        w = weight.contiguous()
        _load().pack_weight_f32(w.data_ptr(), self.out_features, self.in_features, self.data.data_ptr())

    @staticmethod
    def numel(out_features: int, in_features: int) -> int:
        return -(-out_features // PANEL) * in_features * PANEL


def linear(x: torch.Tensor, weight: PackedWeight, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """F.linear(x, w, bias) for x [..., K] fp32 on CPU, w given as a PackedWeight."""
    k, n = weight.in_features, weight.out_features
    if x.dtype != torch.float32 or x.device.type != "cpu" or x.shape[-1] != k:
        raise ValueError(f"packed linear takes fp32 CPU input [..., {k}], got {x.dtype} {tuple(x.shape)}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    y = torch.empty((m, n), dtype=torch.float32)
    if m:
        _load().linear_packed_f32(x2.data_ptr(), x2.stride(0), weight.data.data_ptr(), y.data_ptr(), n, m, n, k)
    if bias is not None:
        y.add_(bias)
    return y.view(*lead, n)


def fits(*tensors: torch.Tensor) -> bool:
    """Our kernels apply: they are on, and every tensor is fp32 on CPU with unit stride in its last dim."""
    if not available():
        return False
    for t in tensors:  # a plain loop: this runs ~50 times a decode step
        if not t.is_cpu or t.dtype != torch.float32 or t.stride(-1) != 1:
            return False
    return True


def handles_paged_decode(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    return fits(q, k_cache) and k_cache.is_contiguous() and q.shape[-1] % 8 == 0


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """q: [B, Hq, D] (one token per sequence); caches: [num_blocks, block_size, Hk, D];
    block_tables: [B, width] int64; context_lens: [B] int64. Returns [B, Hq, D]."""
    q = q.contiguous()
    tables = block_tables.to(torch.int64).contiguous()
    lens = context_lens.to(torch.int64).contiguous()
    b, hq, d = q.shape
    _, block_size, hk, _ = k_cache.shape
    out = torch.empty_like(q)
    _load().paged_decode_attention_f32(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(),
                                    tables.shape[1], lens.data_ptr(), out.data_ptr(), b, hq, hk, d,
                                    block_size, scale)
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm over the last dim of a 2-D x (rows may be strided)."""
    m, d = x.shape
    assert x.stride(1) == 1
    out = torch.empty((m, d), dtype=torch.float32)
    w = weight.contiguous()
    _load().rms_norm_f32(x.data_ptr(), x.stride(0), w.data_ptr(), eps, out.data_ptr(), m, d)
    return out


def rotary_(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Neox rotary embedding applied in place. q: [T, Hq, D], k: [T, Hk, D], each with contiguous
    heads (rows may be strided, e.g. views into the fused qkv output); cos/sin: [P, D] contiguous."""
    t, hq, d = q.shape
    assert q.stride(1) == d and k.stride(1) == d and cos.is_contiguous() and sin.is_contiguous()
    pos = positions.to(torch.int64).contiguous()
    _load().rotary_f32(q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), pos.data_ptr(), cos.data_ptr(),
                       sin.data_ptr(), t, hq, k.shape[1], d)


def write_kv(k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor, k_cache: torch.Tensor,
             v_cache: torch.Tensor) -> None:
    """k_cache/v_cache viewed as [slots, Hk * D]: row slots[t] <- k[t] / v[t]. k, v: [T, Hk, D] with
    contiguous heads (rows may be strided); caches contiguous."""
    t, hk, d = k.shape
    assert k.stride(1) == d and v.stride(1) == d and k_cache.is_contiguous() and v_cache.is_contiguous()
    s = slots.to(torch.int64).contiguous()
    _load().write_kv_f32(k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), s.data_ptr(), k_cache.data_ptr(),
                         v_cache.data_ptr(), t, hk * d)


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU of a contiguous [M, 2I]: silu(x[:, :I]) * x[:, I:]."""
    x = x.contiguous()  # bound to a name: a temporary would be freed before the C call reads it
    m, two_i = x.shape
    out = torch.empty((m, two_i // 2), dtype=torch.float32)
    _load().silu_mul_f32(x.data_ptr(), out.data_ptr(), m, two_i // 2)
    return out


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """x.argmax(dim=-1) for a 2-D x (torch's CPU argmax is not vectorised: 1.2 ms for 32 x 32000)."""
    x = x.contiguous()
    out = torch.empty(x.shape[0], dtype=torch.int64)
    _load().argmax_rows_f32(x.data_ptr(), x.shape[0], x.shape[1], out.data_ptr())
    return out
