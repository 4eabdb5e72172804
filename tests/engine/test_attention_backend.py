"""Which attention backend `engine.attention_backend` gets, decided without a GPU (the choice is pure)."""
import importlib.util

import pytest
import torch

from appliance.engine import attention, cpu_kernels
from appliance.engine.attention import CpuAttentionBackend, TorchAttentionBackend, select_backend

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.fixture
def xformers_installed(monkeypatch):
    """Pretend xformers is importable; constructing its backend is replaced by a marker class."""
    real = importlib.util.find_spec
    monkeypatch.setattr(attention.importlib.util, "find_spec",
                        lambda name, *a: object() if name == "xformers" else real(name, *a))

    class FakeXformers:
        name = "xformers"

    monkeypatch.setattr(attention, "XformersAttentionBackend", FakeXformers)


needs_cpu_kernels = pytest.mark.skipif(not cpu_kernels.available(),
                                       reason=f"CPU kernels unavailable: {cpu_kernels.unavailable_reason()}")


@pytest.fixture
def kernels_off():
    cpu_kernels.enable(False)
    yield
    cpu_kernels.enable(True)


@pytest.mark.parametrize("device, dtype, expected", [
    (CPU, torch.bfloat16, "torch"),
    (CUDA, torch.float32, "torch"),      # xformers' paged kernels are fp16/bf16 only
    (CUDA, torch.bfloat16, "xformers"),
    (CUDA, torch.float16, "xformers"),
])
def test_auto_picks_xformers_only_on_cuda_in_half_precision(xformers_installed, device, dtype, expected):
    assert select_backend("auto", device, dtype).name == expected


@needs_cpu_kernels
def test_auto_picks_our_cpu_kernel_for_fp32_on_cpu():
    assert isinstance(select_backend("auto", CPU, torch.float32), CpuAttentionBackend)


def test_auto_is_torch_on_cpu_with_cpu_kernels_off(kernels_off):
    backend = select_backend("auto", CPU, torch.float32)
    assert type(backend) is TorchAttentionBackend


@pytest.mark.parametrize("device, dtype, message", [
    (CPU, torch.bfloat16, "needs engine.device=cpu and engine.dtype=float32"),
    (CUDA, torch.float32, "needs engine.device=cpu and engine.dtype=float32"),
])
def test_cpu_backend_where_it_cannot_run_is_a_clear_error(device, dtype, message):
    with pytest.raises(ValueError, match=message):
        select_backend("cpu", device, dtype)


def test_cpu_backend_with_kernels_off_says_so(kernels_off):
    with pytest.raises(ValueError, match="engine.cpu_kernels=false"):
        select_backend("cpu", CPU, torch.float32)


def test_auto_without_xformers_is_torch_everywhere():
    if importlib.util.find_spec("xformers") is not None:
        pytest.skip("xformers is installed here")
    assert isinstance(select_backend("auto", CUDA, torch.bfloat16), TorchAttentionBackend)


@pytest.mark.parametrize("device, dtype, message", [
    (CPU, torch.bfloat16, "needs a CUDA device"),
    (CUDA, torch.float32, "needs engine.dtype float16 or bfloat16"),
])
def test_xformers_where_it_cannot_run_is_a_clear_error(xformers_installed, device, dtype, message):
    with pytest.raises(ValueError, match=message):
        select_backend("xformers", device, dtype)


def test_unknown_backend_names_the_choices():
    with pytest.raises(ValueError, match="auto, torch, cpu or xformers"):
        select_backend("flash", CPU)
