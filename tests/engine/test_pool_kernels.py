"""A pool engine's kernel plan: built once from its host (less engine.cpu_features_off) and its config, logged
in one line, and applied to its model's linear layers as a generate engine's runner applies its own."""
import logging

import pytest
import torch
from torch import nn

from appliance.engine import cpu_kernels
from appliance.engine.config import EngineConfig
from appliance.errors import ConfigError
from appliance.engine.host import Host
from appliance.engine.kernel_plan import plan_pool_kernels
from appliance.engine.linear import PlanLinear
from appliance.engine.pool_engine import PoolEngine
from tests.engine.test_kernel_plan import AMX, AVX2, OFF, host

needs_cpu_kernels = pytest.mark.skipif(not cpu_kernels.available(),
                                       reason=f"CPU kernels unavailable: {cpu_kernels.unavailable_reason()}")
NEWER_UNITS = sorted(AMX - AVX2)  # what makes an AMX host run the AVX2 paths


class TinyMLP(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.up, self.down = nn.Linear(24, 40), nn.Linear(40, 8)

    def forward(self, x):
        return self.down(self.up(x).relu())


def host_of(flags) -> Host:
    return Host(frozenset(flags), 16 << 30, 16 << 30)


def kernel_lines(caplog):
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("kernels (")]


@pytest.mark.parametrize("device, dtype, cpu_features, fragments", [
    ("cpu", "float32", AVX2, ["kernels (pool, cpu, float32): gemm float32 every row=ours packed",
                              "attention=torch sdpa"]),
    ("cpu", "bfloat16", AVX2, ["gemm bfloat16 every row=ours packed (avx2 fma, widened to fp32)"]),
    # bf16 units: oneDNN's GEMM, which beats our VDPBF16PS one at a batch of tiles' rows
    ("cpu", "bfloat16", AVX2 | {"avx512_bf16"}, ["kernels (pool, cpu, bfloat16): gemm bfloat16=torch;"]),
    ("cpu", "bfloat16", AMX, ["gemm bfloat16 rows 1-2=ours bf16-weight, other rows=torch"]),
    ("cuda", "bfloat16", AMX, [("kernels (pool, cuda, bfloat16): gemm bfloat16=torch; attention=torch sdpa "
                                "(our CPU kernels off: engine.device=cuda)")]),
])
def test_the_pool_plan_is_the_gemm_rules_and_torch_attention(device, dtype, cpu_features, fragments, monkeypatch):
    """The generate engine's GEMM rules for the host; nothing of the paged attention, fused ops or sampler."""
    monkeypatch.setattr(cpu_kernels, "available", lambda: True)  # the rules, whatever this machine built
    plan = plan_pool_kernels(EngineConfig(kind="pool", device=device, dtype=dtype), host_of(cpu_features))
    line = plan.describe()
    assert plan.pool and not plan.fused_ops and not plan.argmax and plan.int8 is None
    assert "rmsnorm" not in line and "argmax" not in line
    for fragment in fragments:
        assert fragment in line


def test_a_pool_engine_refuses_int8_naming_the_setting():
    with pytest.raises(ConfigError, match="engine.quantization=int8 applies to a language model"):
        EngineConfig(kind="pool", quantization="int8")
    with pytest.raises(ValueError, match="engine.quantization=int8: pool models run unquantized"):
        PoolEngine(TinyMLP(), EngineConfig(quantization="int8"), host=host("avx2"))


@needs_cpu_kernels
def test_cpu_features_off_gives_a_pool_engine_the_avx2_gemm_and_one_log_line(caplog):
    """An AMX host with its newer units hidden plans (and packs) for the AVX2 bf16 GEMM; the engine logs the
    flags it hid and its plan, once; its answers are the torch GEMM's within bf16 rounding."""
    x = torch.randn(5, 24, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    ref = TinyMLP().to(torch.bfloat16)(x).float()
    cfg = EngineConfig(kind="pool", dtype="bfloat16", cpu_features_off=NEWER_UNITS)
    with caplog.at_level(logging.INFO, logger="appliance.engine"):
        engine = PoolEngine(TinyMLP(), cfg, host=host("amx"))
    [line] = kernel_lines(caplog)
    assert line == engine.kernels.describe()
    assert "gemm bfloat16 every row=ours packed (avx2 fma, widened to fp32)" in line
    assert f"CPU features treated as absent (engine.cpu_features_off): {' '.join(NEWER_UNITS)}" in caplog.text
    layers = [engine.model.up, engine.model.down]
    assert all(isinstance(m, PlanLinear) and m.packed is not None and not m.packed.bf16_units for m in layers)
    out = engine.encode([x])[0].float()
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="appliance.engine"):
        full = PoolEngine(TinyMLP(), EngineConfig(kind="pool", dtype="bfloat16"), host=host("amx"))
    assert "rows 1-2=ours bf16-weight" in full.kernels.describe()
    assert all(m.packed is None and m.bf16_kernel_rows for m in (full.model.up, full.model.down))


@needs_cpu_kernels
def test_cpu_kernels_off_leaves_a_pool_model_on_torch(caplog):
    with caplog.at_level(logging.INFO, logger="appliance.engine"):
        engine = PoolEngine(TinyMLP(), EngineConfig(kind="pool", dtype="float32", cpu_kernels=False), host=host("avx2"))
    [line] = kernel_lines(caplog)
    assert line.endswith(f"(our CPU kernels off: {OFF})") and "gemm float32=torch" in line
    assert type(engine.model.up) is nn.Linear


@needs_cpu_kernels
@pytest.mark.parametrize("dtype, tolerance", [("float32", 1e-4), ("bfloat16", 5e-2)])
def test_prithvi_on_the_packed_gemm_matches_torch(dtype, tolerance):
    """A small Prithvi through a pool engine on an AVX2 host's plan: every linear layer packed, activations
    in the engine's dtype all the way (a bf16 GEMM takes nothing else), logits torch's within rounding."""
    from appliance.engine.models.prithvi import build_prithvi_segmentation
    from tests.prithvi.helpers import small_cfg

    def model():
        torch.manual_seed(0)
        return build_prithvi_segmentation(small_cfg(), in_chans=6).eval()

    x = torch.randn(2, 6, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = model().to(getattr(torch, dtype))(x.to(getattr(torch, dtype))).float()
    engine = PoolEngine(model(), EngineConfig(kind="pool", dtype=dtype), host=host("avx2"))
    assert engine.kernels.packed_gemm
    linears = [m for m in engine.model.modules() if isinstance(m, PlanLinear)]
    assert linears and all(m.packed is not None for m in linears)
    assert not any(type(m) is nn.Linear for m in engine.model.modules())
    torch.testing.assert_close(engine.encode([x])[0].float(), ref, rtol=tolerance, atol=tolerance)
