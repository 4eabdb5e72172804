"""Which attention backend an engine runs: `auto` picks by device, dtype and what is installed (xformers
is probed with a forward of every step kind before it is trusted); an explicit choice that cannot run
is refused with the reason, before any request. The engine's kernel plan (kernel_plan.py) asks once and
keeps the name; each runner builds its backend from it (`make_backend`)."""
import importlib.util
import logging
from typing import Optional

import torch

from appliance.engine import cpu_kernels
from appliance.engine.attention import CpuAttentionBackend, TorchAttentionBackend
from appliance.engine.attention_probe import probe_backend
from appliance.engine.config import AttentionBackend, dtype_name
from appliance.engine.xformers_attention import XformersAttentionBackend
from appliance.engine.xformers_plan import XformersLimits, config_refusal

log = logging.getLogger(__name__)

# The dtypes of the caches our paged decode attention reads, by name (a config names them so).
CPU_BACKEND_DTYPES = tuple(dtype_name(d) for d in cpu_kernels.PAGED_DECODE_DTYPES)


def cpu_backend_refusal(device: str, dtype: Optional[str]) -> Optional[str]:
    """Why attention_backend=cpu cannot run on `device` (cpu, cuda, cuda:N) in `dtype` (a name; None:
    not settled yet, as engine.dtype=auto on CPU before the checkpoint is read); None: it can."""
    if device != "cpu" or (dtype is not None and dtype not in CPU_BACKEND_DTYPES):
        return (f"attention_backend=cpu needs engine.device=cpu and engine.dtype float32 or bfloat16 (got "
                f"{device}, {dtype or 'auto'}); use attention_backend=torch (or auto)")
    return None


def select_backend(name: AttentionBackend, device: torch.device, dtype: torch.dtype = torch.float32, geometry=None,
                   probe=None, fmha=None, cpu_kernels_off: Optional[str] = None) -> str:
    """The backend's name. `auto`: xformers on CUDA where it runs every kind of step of this engine (its
    kernels' limits, then a probe forward of each kind at start; otherwise the torch backend and one
    logged line saying why), our CPU kernel for fp32 or bf16 on CPU where the engine runs our kernels
    (`cpu_kernels_off` None; else why it does not), else torch. An explicit choice that cannot run raises
    ValueError with the reason, before any request. `geometry` (an AttentionGeometry) is needed on CUDA;
    `probe` and `fmha` replace the real ones in tests."""
    if name is AttentionBackend.auto:
        if device.type == "cuda":
            return _auto_on_cuda(device, dtype, geometry, probe, fmha)
        if device.type == "cpu" and dtype in cpu_kernels.PAGED_DECODE_DTYPES and cpu_kernels_off is None:
            return CpuAttentionBackend.name
        return TorchAttentionBackend.name
    if name is AttentionBackend.torch:
        return TorchAttentionBackend.name
    if name is AttentionBackend.cpu:
        why = cpu_backend_refusal(device.type, dtype_name(dtype))
        if why:
            raise ValueError(why)
        if cpu_kernels_off:
            raise ValueError(f"attention_backend=cpu: our CPU kernels are unavailable ({cpu_kernels_off}); use "
                             f"attention_backend=torch (or auto)")
        return CpuAttentionBackend.name
    if name is AttentionBackend.xformers:
        why = _xformers_refusal(device, dtype, geometry, probe, fmha)
        if why:
            raise ValueError(f"attention_backend=xformers cannot run here: {why}; use attention_backend=torch "
                             f"(or auto)")
        return XformersAttentionBackend.name
    # EngineConfig holds members (a name becomes one when the config is built): anything else is a caller's bug
    raise TypeError(f"attention_backend: expected an AttentionBackend member, got {name!r}")


def make_backend(name: str, fmha=None):
    """A fresh backend of a name `select_backend` gave (each runner its own: backends keep scratch)."""
    if name == XformersAttentionBackend.name:
        return XformersAttentionBackend(fmha)
    return {CpuAttentionBackend.name: CpuAttentionBackend, TorchAttentionBackend.name: TorchAttentionBackend}[name]()


def _auto_on_cuda(device, dtype, geometry, probe, fmha) -> str:
    if fmha is None and importlib.util.find_spec("xformers") is None:
        log.info("attention_backend=auto: xformers is not installed; using the torch backend")
        return TorchAttentionBackend.name
    why = _xformers_refusal(device, dtype, geometry, probe, fmha)
    if why:
        log.warning("attention_backend=auto: xformers cannot run this engine (%s); using the torch backend", why)
        return TorchAttentionBackend.name
    return XformersAttentionBackend.name


def _xformers_refusal(device, dtype, geometry, probe, fmha) -> Optional[str]:
    """Why xformers cannot run this engine (None: it can): the kernels' declared limits first, then a
    probe forward."""
    if device.type != "cuda":
        return f"it needs a CUDA device (engine.device={device})"
    if fmha is None and importlib.util.find_spec("xformers") is None:
        return "xformers is not installed (pip install --no-deps xformers==0.0.35)"
    if geometry is None:
        raise ValueError("select_backend needs the model's attention geometry to check xformers")
    try:
        backend = XformersAttentionBackend(fmha)
    except Exception as e:  # noqa: BLE001 - e.g. an xformers built for another torch fails on import
        return f"importing xformers failed: {_first_line(e)}"
    why = config_refusal(geometry.block_size, dtype, geometry.head_dim, XformersLimits.from_fmha(backend.fmha))
    return why or (probe or probe_backend)(backend, geometry, device, dtype)


def _first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"
