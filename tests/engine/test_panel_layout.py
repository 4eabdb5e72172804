"""The packed weights' layout is written once (csrc/panel_layout.h): the shape cpu_kernels.py asks the built
library for is the layout the kernels pack into, and the buffer the operator takes."""
import re
from pathlib import Path

import pytest
import torch

from appliance.engine import cpu_kernels
from appliance.engine.cpu_kernels import PackedWeight

pytestmark = pytest.mark.skipif(not cpu_kernels.available(),
                                reason=f"CPU kernels unavailable: {cpu_kernels.unavailable_reason()}")
ENGINE = Path(cpu_kernels.__file__).parent


def weight(n: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(n * 1000 + k)
    if dtype == torch.int8:
        return torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    return torch.randn(n, k, generator=g).to(dtype)


def expected_panels(w: torch.Tensor, shape) -> torch.Tensor:
    """`w` laid out as `shape` says: panel p, k row r, value v = output p * cols + v // g, k = r * g + v % g
    (g k side by side, cols = width / g outputs a panel), zero-padded."""
    panels, rows, width = shape
    g = 1 if w.dtype == torch.float32 else 4 // w.element_size()
    cols = width // g
    padded = torch.zeros(panels * cols, rows * g, dtype=w.dtype)
    padded[:w.shape[0], :w.shape[1]] = w
    return padded.view(panels, cols, rows, g).permute(0, 2, 1, 3).reshape(panels, rows, width)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
@pytest.mark.parametrize("n, k", [(1, 1), (17, 5), (33, 7), (64, 128), (70, 1027)])
def test_the_librarys_shape_is_the_layout_the_kernels_pack(dtype, n, k):
    w = weight(n, k, dtype)
    scale = torch.ones(n) if dtype == torch.int8 else None
    packed = PackedWeight(w, scale=scale).data
    shape = PackedWeight.shape(n, k, dtype)
    assert tuple(packed.shape) == shape and PackedWeight.numel(n, k, dtype) == packed.numel()
    want = expected_panels(w, shape)
    if dtype == torch.int8:  # stored as unsigned bytes q + 128: the padding is a flipped 0 too
        want = (want.view(torch.uint8) ^ 0x80).view(torch.int8)
    assert torch.equal(packed, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_a_buffer_of_another_size_is_refused(dtype):
    n, k = 40, 9
    numel = PackedWeight.numel(n, k, dtype)
    with pytest.raises(ValueError, match=f"out must be a contiguous {numel}-element buffer"):
        cpu_kernels.ops().pack_weight(weight(n, k, dtype), torch.empty(numel + 1, dtype=dtype))


def test_the_shape_of_a_dtype_that_does_not_pack_is_refused():
    with pytest.raises(ValueError, match="weight must be float32, bfloat16 or int8, got Half"):
        PackedWeight.shape(16, 16, torch.float16)


def test_panel_widths_are_defined_in_one_header():
    """No other kernel source or Python module defines a panel's width."""
    sources = [*ENGINE.glob("csrc/*"), *ENGINE.glob("*.py")]
    definition = re.compile(r"#define B?PANEL\b|kPanel|kGroupPanel|^\s*(GROUP_)?PANEL\s*=", re.MULTILINE)
    defining = [p.name for p in sources if definition.search(p.read_text())]
    assert defining == ["panel_layout.h"]
