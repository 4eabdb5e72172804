"""Which attention backend an engine runs: `auto` picks by device, dtype and what is installed (xformers
is probed with a forward of every step kind before it is trusted); an explicit choice that cannot run
is refused with the reason, before any request."""
import importlib.util
import logging

import torch

from appliance.engine import cpu_kernels
from appliance.engine.attention import CpuAttentionBackend, TorchAttentionBackend
from appliance.engine.attention_probe import probe_backend
from appliance.engine.xformers_attention import XformersAttentionBackend
from appliance.engine.xformers_plan import XformersLimits, config_refusal

log = logging.getLogger(__name__)


def select_backend(name: str, device: torch.device, dtype: torch.dtype = torch.float32, geometry=None,
                   probe=None, fmha=None, use_cpu_kernels: bool = True):
    """`auto`: xformers on CUDA where it runs every kind of step of this engine (its kernels' limits,
    then a probe forward of each kind at start; otherwise the torch backend and one logged line saying
    why), our CPU kernel for fp32 or bf16 on CPU where it builds (and `use_cpu_kernels`, the engine's
    engine.cpu_kernels, is on), else torch. An explicit choice that cannot run raises ValueError with the
    reason, before any request. `geometry` (an AttentionGeometry) is needed on CUDA; `probe` and `fmha`
    replace the real ones in tests."""
    name = getattr(name, "value", name)
    if name == "auto":
        if device.type == "cuda":
            return _auto_on_cuda(device, dtype, geometry, probe, fmha)
        if device.type == "cpu" and dtype in cpu_kernels.PAGED_DECODE_DTYPES and use_cpu_kernels \
                and cpu_kernels.available():
            return CpuAttentionBackend()
        return TorchAttentionBackend()
    if name == "torch":
        return TorchAttentionBackend()
    if name == "cpu":
        if device.type != "cpu" or dtype not in cpu_kernels.PAGED_DECODE_DTYPES:
            raise ValueError("attention_backend=cpu needs engine.device=cpu and engine.dtype float32 or "
                             "bfloat16; use attention_backend=torch (or auto)")
        if not use_cpu_kernels or not cpu_kernels.available():
            why = "engine.cpu_kernels=false" if not use_cpu_kernels else cpu_kernels.unavailable_reason()
            raise ValueError(f"attention_backend=cpu: our CPU kernels are unavailable ({why}); use "
                             f"attention_backend=torch (or auto)")
        return CpuAttentionBackend()
    if name == "xformers":
        backend, why = _try_xformers(device, dtype, geometry, probe, fmha)
        if why:
            raise ValueError(f"attention_backend=xformers cannot run here: {why}; use attention_backend=torch "
                             f"(or auto)")
        return backend
    raise ValueError(f"unknown attention_backend {name!r}; choose auto, torch, cpu or xformers")


def _auto_on_cuda(device, dtype, geometry, probe, fmha):
    if fmha is None and importlib.util.find_spec("xformers") is None:
        log.info("attention_backend=auto: xformers is not installed; using the torch backend")
        return TorchAttentionBackend()
    backend, why = _try_xformers(device, dtype, geometry, probe, fmha)
    if why:
        log.warning("attention_backend=auto: xformers cannot run this engine (%s); using the torch backend", why)
        return TorchAttentionBackend()
    return backend


def _try_xformers(device, dtype, geometry, probe, fmha):
    """(backend, None), or (None, why): the kernels' declared limits first, then a probe forward."""
    if device.type != "cuda":
        return None, f"it needs a CUDA device (engine.device={device})"
    if fmha is None and importlib.util.find_spec("xformers") is None:
        return None, "xformers is not installed (pip install --no-deps xformers==0.0.35)"
    if geometry is None:
        raise ValueError("select_backend needs the model's attention geometry to check xformers")
    try:
        backend = XformersAttentionBackend(fmha)
    except Exception as e:  # e.g. an xformers built for another torch fails on import
        return None, f"importing xformers failed: {_first_line(e)}"
    why = config_refusal(geometry.block_size, dtype, geometry.head_dim, XformersLimits.from_fmha(backend.fmha))
    if why is None:
        why = (probe or probe_backend)(backend, geometry, device, dtype)
    return (None, why) if why else (backend, None)


def _first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"
