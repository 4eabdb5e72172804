"""Which attention backend `engine.attention_backend` gets, decided without a GPU (the choice is pure)."""
import importlib.util

import pytest
import torch

from appliance.engine import attention
from appliance.engine.attention import TorchAttentionBackend, select_backend

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


@pytest.mark.parametrize("device, dtype, expected", [
    (CPU, torch.float32, "torch"),
    (CPU, torch.bfloat16, "torch"),
    (CUDA, torch.float32, "torch"),      # xformers' paged kernels are fp16/bf16 only
    (CUDA, torch.bfloat16, "xformers"),
    (CUDA, torch.float16, "xformers"),
])
def test_auto_picks_xformers_only_on_cuda_in_half_precision(xformers_installed, device, dtype, expected):
    assert select_backend("auto", device, dtype).name == expected


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
    with pytest.raises(ValueError, match="auto, torch or xformers"):
        select_backend("flash", CPU)
