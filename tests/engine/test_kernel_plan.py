"""One kernel plan per engine: for each host (AVX2 alone, AVX512-BF16, +VNNI, AMX), dtype, quantization
and device, the plan names the kernels the engine ran before the choice had one home (the expected rows
below restate that code's rules); the engine reads its host from its own `Host`, logs the plan in one
line, and each runner applies it."""
import dataclasses
import logging
import pickle

import pytest
import torch

from appliance.engine import cpu_kernels, kernel_plan
from appliance.engine.config import EngineConfig
from appliance.engine.host import Host
from appliance.engine.int8 import Int8Plan
from appliance.engine.kernel_plan import (BF16_WEIGHT_ROWS_NATIVE, INT8_WEIGHT_ROWS, KernelPlan, choose_kernels,
                                          cpu_kernels_off, plan_kernels)

AVX2 = frozenset({"avx2", "fma"})
AVX512_BF16 = AVX2 | {"avx512f", "avx512bw", "avx512_bf16"}
AVX512_VNNI = AVX512_BF16 | {"avx512_vnni"}
AMX = AVX512_VNNI | {"amx_bf16", "amx_tile", "amx_int8"}
HOSTS = {"avx2": AVX2, "avx512_bf16": AVX512_BF16, "avx512_vnni": AVX512_VNNI, "amx": AMX}
OFF = "engine.cpu_kernels=false"
NONE = range(0)

needs_cpu_kernels = pytest.mark.skipif(not cpu_kernels.available(),
                                       reason=f"CPU kernels unavailable: {cpu_kernels.unavailable_reason()}")


def host(name: str) -> Host:
    return Host(HOSTS[name], 16 << 30, 16 << 30)


def plan(host_name, dtype, quantization="none", device="cpu", off=None, attention="cpu") -> KernelPlan:
    cfg = EngineConfig(dtype=dtype, quantization=quantization, device=device)
    return choose_kernels(cfg, host(host_name), off, attention)


# (host, dtype, quantization, device, why our kernels are off) -> (packed GEMM, bf16-weight rows, int8
# plan, fused small ops, argmax): what the runner did before the plan (packs_bf16 / packs_int8 /
# bf16_kernel_rows / Int8Plan.for_host, each on the host's flags), but for bf16 weights without bf16
# units, packed for the AVX2 GEMM since it came (before: rows 2-128 on the few-row GEMM, the rest torch),
# and for int8 weights without AMX, packed for the AVX2 int8 GEMM where there is no VNNI (before: our
# few-row GEMM, torch's kernel, tiles).
CASES = {
    # fp32 with ours: every GEMM packed, the fused ops and the argmax ours, on any x86 host (bf16 too since
    # the small ops took bf16; fp16 stays on torch).
    "fp32 avx2": (("avx2", "float32", "none", "cpu", None), (True, NONE, None, True, True)),
    "fp32 amx": (("amx", "float32", "none", "cpu", None), (True, NONE, None, True, True)),
    # bf16: packed wherever there is no AMX (VDPBF16PS or AVX2 FMA), else a few rows on our bf16-weight GEMM.
    "bf16 avx2": (("avx2", "bfloat16", "none", "cpu", None), (True, NONE, None, True, True)),
    "bf16 avx512_bf16": (("avx512_bf16", "bfloat16", "none", "cpu", None), (True, NONE, None, True, True)),
    "bf16 amx": (("amx", "bfloat16", "none", "cpu", None), (False, BF16_WEIGHT_ROWS_NATIVE, None, True, True)),
    "fp16 avx2": (("avx2", "float16", "none", "cpu", None), (False, NONE, None, False, False)),
    # int8: our packed GEMM wherever there is no AMX (VPDPBUSD with VNNI, else VPMADDUBSW on AVX2); with
    # AMX our few-row GEMM, torch's kernel, tiles.
    "int8 fp32 avx2": (("avx2", "float32", "int8", "cpu", None),
                       (True, NONE, Int8Plan(0, torch.float32, packed=True), True, True)),
    "int8 bf16 avx2": (("avx2", "bfloat16", "int8", "cpu", None),
                       (True, NONE, Int8Plan(0, torch.float32, packed=True), True, True)),
    "int8 bf16 avx512_bf16": (("avx512_bf16", "bfloat16", "int8", "cpu", None),
                              (True, NONE, Int8Plan(0, torch.bfloat16, packed=True), True, True)),
    "int8 bf16 avx512_vnni": (("avx512_vnni", "bfloat16", "int8", "cpu", None),
                              (True, NONE, Int8Plan(0, torch.bfloat16, packed=True, vnni=True), True, True)),
    "int8 fp32 avx512_vnni": (("avx512_vnni", "float32", "int8", "cpu", None),
                              (True, NONE, Int8Plan(0, torch.bfloat16, packed=True, vnni=True), True, True)),
    "int8 fp32 amx": (("amx", "float32", "int8", "cpu", None),
                      (True, NONE, Int8Plan(16, torch.bfloat16, INT8_WEIGHT_ROWS), True, True)),
    "int8 bf16 amx": (("amx", "bfloat16", "int8", "cpu", None),
                      (False, BF16_WEIGHT_ROWS_NATIVE, Int8Plan(16, torch.bfloat16, INT8_WEIGHT_ROWS), True, True)),
    # Without ours (engine.cpu_kernels=false, or no library): torch for everything.
    "fp32 avx2 off": (("avx2", "float32", "none", "cpu", OFF), (False, NONE, None, False, False)),
    "bf16 avx512_bf16 off": (("avx512_bf16", "bfloat16", "none", "cpu", "no compiler"),
                             (False, NONE, None, False, False)),
    "int8 fp32 avx2 off": (("avx2", "float32", "int8", "cpu", OFF),
                           (False, NONE, Int8Plan(192, torch.float32), False, False)),
    "int8 bf16 avx512_vnni off": (("avx512_vnni", "bfloat16", "int8", "cpu", OFF),
                                  (False, NONE, Int8Plan(16, torch.bfloat16), False, False)),
    # CUDA: torch's kernels (int8: its kernel up to the host's row count, tiles in the activations' dtype).
    "bf16 cuda": (("amx", "bfloat16", "none", "cuda", "engine.device=cuda"), (False, NONE, None, False, False)),
    "int8 fp16 cuda avx2": (("avx2", "float16", "int8", "cuda", "engine.device=cuda"),
                            (False, NONE, Int8Plan(192, torch.float32), False, False)),
    "int8 fp16 cuda amx": (("amx", "float16", "int8", "cuda", "engine.device=cuda"),
                           (False, NONE, Int8Plan(16, torch.bfloat16), False, False)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_plan_chooses_what_the_engine_ran_before(case):
    (host_name, dtype, quantization, device, off), expected = CASES[case]
    p = plan(host_name, dtype, quantization, device, off)
    assert (p.packed_gemm, p.bf16_weight_rows, p.int8, p.fused_ops, p.argmax) == expected
    assert p.bf16_units == ("avx512_bf16" in HOSTS[host_name])  # packed bf16: VDPBF16PS, else AVX2 FMA
    assert (p.device, p.dtype, p.cpu_kernels_off) == (device, getattr(torch, dtype), off)


def test_our_kernels_are_off_for_a_reason():
    assert cpu_kernels_off(EngineConfig(cpu_kernels=False), "cpu") == OFF
    assert cpu_kernels_off(EngineConfig(device="cuda"), "cuda") == "engine.device=cuda"


def test_a_missing_library_is_the_reason_and_cuda_never_loads_it(monkeypatch):
    monkeypatch.setattr(cpu_kernels, "available", lambda: False)
    monkeypatch.setattr(cpu_kernels, "unavailable_reason", lambda: "no C/C++ compiler")
    assert cpu_kernels_off(EngineConfig(), "cpu") == "no C/C++ compiler"
    monkeypatch.setattr(cpu_kernels, "available", lambda: pytest.fail("a CUDA engine loaded our CPU kernels"))
    assert cpu_kernels_off(EngineConfig(device="cuda"), "cuda") == "engine.device=cuda"


@pytest.mark.parametrize("cfg, off, attention", [
    (EngineConfig(dtype="float32"), None, "cpu"),
    (EngineConfig(dtype="bfloat16"), None, "cpu"),
    (EngineConfig(dtype="float16"), None, "torch"),
    (EngineConfig(dtype="float32", cpu_kernels=False), OFF, "torch"),
    (EngineConfig(dtype="float32", attention_backend="torch"), None, "torch"),
])
def test_the_attention_backend_is_in_the_plan(cfg, off, attention, monkeypatch):
    monkeypatch.setattr(kernel_plan, "cpu_kernels_off", lambda cfg, device: off if cfg.cpu_kernels else OFF)
    assert plan_kernels(cfg, host("avx2"), None).attention == attention


def test_an_explicit_choice_that_cannot_run_is_refused_naming_the_setting(monkeypatch):
    with pytest.raises(ValueError, match=r"our CPU kernels are unavailable \(engine.cpu_kernels=false\)"):
        plan_kernels(EngineConfig(dtype="float32", attention_backend="cpu", cpu_kernels=False), host("avx2"), None)
    monkeypatch.setattr(kernel_plan, "kernel_problem", lambda device: "torch has no int8 weight kernel on cpu")
    with pytest.raises(ValueError, match="engine.quantization=int8 cannot run: torch has no int8 weight kernel"):
        plan_kernels(EngineConfig(dtype="float32", quantization="int8"), host("avx2"), None)


@pytest.mark.parametrize("case, fragments", [
    ("fp32 avx2", ["kernels (cpu, float32): gemm float32 every row=ours packed",
                   "attention=cpu (prefill=torch sdpa, decode=ours paged)", "rmsnorm/rotary/swiglu/kv-write=ours",
                   "argmax=ours"]),
    ("bf16 avx2", ["gemm bfloat16 every row=ours packed (avx2 fma, widened to fp32)",
                   "rmsnorm/rotary/swiglu/kv-write=ours", "argmax=ours"]),
    ("bf16 avx512_bf16", ["gemm bfloat16 every row=ours packed (vdpbf16ps)"]),
    ("bf16 amx", ["gemm bfloat16 rows 1-2=ours bf16-weight, other rows=torch"]),
    ("int8 bf16 avx2", ["gemm bfloat16 (unquantized weights) every row=ours packed (avx2 fma, widened to fp32)",
                        "gemm int8 every row=ours packed (avx2 vpmaddubsw)"]),
    ("int8 fp32 amx", ["gemm int8 rows 1-32=ours int8-weight, rows 33+=torch bfloat16 tiles"]),
    ("int8 bf16 avx512_vnni", ["gemm bfloat16 (unquantized weights) every row=ours packed (vdpbf16ps)",
                               "gemm int8 every row=ours packed (vpdpbusd)"]),
    ("int8 fp32 avx2 off", ["gemm float32 (unquantized weights)=torch",
                            "gemm int8 rows 1-192=torch int8 kernel, rows 193+=torch float32 tiles",
                            "(our CPU kernels off: engine.cpu_kernels=false)"]),
    ("int8 fp16 cuda amx", ["kernels (cuda, float16)", "rows 1-16=torch int8 kernel, rows 17+=torch float16 tiles"]),
])
def test_one_line_names_each_familys_kernel(case, fragments):
    (host_name, dtype, quantization, device, off), _ = CASES[case]
    line = plan(host_name, dtype, quantization, device, off).describe()
    assert "\n" not in line
    for fragment in fragments:
        assert fragment in line


def test_a_plan_is_frozen_and_travels_to_tensor_parallel_ranks():
    p = plan("avx2", "bfloat16", "int8")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.packed_gemm = True
    assert pickle.loads(pickle.dumps(p)) == p


@needs_cpu_kernels
@pytest.mark.parametrize("host_name", ["avx2", "avx512_bf16", "amx"])
def test_the_engine_plans_for_its_own_host_and_says_so_once(llama_dir, caplog, host_name):
    """The host given to the engine (not one read again) decides, whatever this CPU has; one INFO line names
    the kernels; the runner's layers follow the plan: packed for the AVX2 GEMM on a host without bf16 units,
    for VDPBF16PS on one with AVX512-BF16 (built, not run: packing is plain C), a few rows on torch's
    layout with AMX."""
    from appliance.engine.linear import PackableLinear
    from appliance.engine.llm_engine import LLMEngine

    with caplog.at_level(logging.INFO, logger="appliance.engine"):
        engine = LLMEngine(llama_dir, EngineConfig(dtype="bfloat16", num_kv_blocks=16), host=host(host_name))
    assert engine.kernels == plan(host_name, "bfloat16")
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("kernels (")]
    assert line == engine.kernels.describe()
    runner = engine.executor.runner
    assert runner.plan is engine.kernels and runner.attn_backend.name == "cpu"
    layers = [m for m in runner.model.modules() if isinstance(m, PackableLinear)]
    assert layers
    if host_name == "amx":
        assert "rows 1-2=ours bf16-weight" in line
        assert all(m.bf16_kernel_rows == BF16_WEIGHT_ROWS_NATIVE and m.packed is None for m in layers)
    else:
        units = host_name == "avx512_bf16"
        assert f"every row=ours packed ({'vdpbf16ps' if units else 'avx2 fma'}" in line
        assert all(m.packed is not None and m.packed.bf16_units == units and not m.bf16_kernel_rows for m in layers)


@needs_cpu_kernels
def test_cpu_features_off_plan_an_amx_host_as_an_avx2_one(llama_dir, caplog):
    """engine.cpu_features_off, given as a config override, hides the named flags from this engine's dtype
    and kernel rules: an AMX host then runs the AVX2 paths, and the start-up log says which flags it hid.
    Another engine on the same host, without the setting, still plans for AMX."""
    from omegaconf import OmegaConf

    from appliance.engine.config import engine_config_from
    from appliance.engine.llm_engine import LLMEngine

    off = sorted(AMX - AVX2)
    node = OmegaConf.merge(OmegaConf.create({"dtype": "bfloat16", "num_kv_blocks": 16}),
                           OmegaConf.from_dotlist([f"cpu_features_off=[{','.join(off)}]"]))
    with caplog.at_level(logging.INFO, logger="appliance.engine"):
        hidden = LLMEngine(llama_dir, engine_config_from(node), host=host("amx"))
    assert hidden.kernels == plan("avx2", "bfloat16")
    assert f"CPU features treated as absent (engine.cpu_features_off): {' '.join(off)}" in caplog.text
    full = LLMEngine(llama_dir, EngineConfig(dtype="bfloat16", num_kv_blocks=16), host=host("amx"))
    assert full.kernels == plan("amx", "bfloat16")
