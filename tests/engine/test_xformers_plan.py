"""The xformers backend's dispatch decisions as a table: (step kind, block size, dtype, head dim) ->
op or refusal, against the limits read from the installed xformers (when importable), from the fake
module, and the values recorded from 0.0.35 that `appliance check` uses without xformers."""
import pytest

from appliance.engine.xformers_plan import (DECODE, MIXED, PREFILL, XFORMERS_0_0_35, XformersLimits,
                                            config_refusal, plan)
from tests.engine.fake_fmha import fake_fmha, real_xformers_fmha


def _limits(source):
    if source == "recorded":
        return XFORMERS_0_0_35
    if source == "fake":
        return XformersLimits.from_fmha(fake_fmha())
    fmha = real_xformers_fmha()
    if fmha is None:
        pytest.skip("xformers is not installed here, or does not import beside this torch")
    return XformersLimits.from_fmha(fmha)


SOURCES = ["installed", "fake", "recorded"]
SPLITK, FLASH = "triton_splitk.FwOp", "flash.FwOp"

TABLE = [  # kind, block size, dtype, head dim -> op, or a fragment of the refusal
    (DECODE, 64, "bfloat16", 64, SPLITK),
    (DECODE, 128, "float16", 128, SPLITK),
    (DECODE, 256, "bfloat16", 512, SPLITK),
    (DECODE, 16, "bfloat16", 64, "engine.block_size=16: xformers' triton_splitk.FwOp"),
    (DECODE, 96, "float16", 64, "must be a multiple of 64"),
    (DECODE, 64, "float32", 64, "engine.dtype=float32: xformers' triton_splitk.FwOp (decode steps) runs only"),
    (DECODE, 64, "bfloat16", 80, "head dim 80: xformers' triton_splitk.FwOp"),
    (DECODE, 64, "bfloat16", 96, "takes head dims 16, 32, 64, 128, 256, 512"),
    (PREFILL, 16, "bfloat16", 96, FLASH),  # contiguous keys: any block size
    (PREFILL, 64, "float16", 256, FLASH),
    (PREFILL, 64, "float32", 64, "engine.dtype=float32: xformers' flash.FwOp (prefill steps)"),
    (PREFILL, 64, "bfloat16", 512, "head dim 512: xformers' flash.FwOp (prefill steps) takes head dims multiples of 8"),
    (MIXED, 16, "float16", 64, FLASH),
    (MIXED, 64, "bfloat16", 12, "head dim 12"),
]


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("kind, block_size, dtype, head_dim, expected", TABLE)
def test_dispatch_table(source, kind, block_size, dtype, head_dim, expected):
    op, why = plan(kind, block_size, dtype, head_dim, _limits(source))
    if expected in (SPLITK, FLASH):
        assert (op, why) == (expected, None)
    else:
        assert op is None and expected in why, why


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("block_size, dtype, head_dim, expected", [
    (64, "bfloat16", 64, None),
    (128, "float16", 128, None),
    (16, "bfloat16", 64, "engine.block_size=16"),     # decode steps refuse what prefill steps take
    (64, "bfloat16", 96, "(decode steps)"),
    (64, "bfloat16", 512, "(prefill steps)"),        # and the other way round
    (64, "float32", 64, "engine.dtype=float32"),
    (64, "float16", None, None),                     # head dim unknown: the rest is still checked
    (32, "float16", None, "engine.block_size=32"),
])
def test_a_config_runs_only_if_every_step_kind_has_a_kernel(source, block_size, dtype, head_dim, expected):
    why = config_refusal(block_size, dtype, head_dim, _limits(source))
    assert why is None if expected is None else expected in why, why


@pytest.mark.parametrize("source", ["installed", "fake"])
def test_recorded_limits_are_what_the_module_declares(source):
    assert _limits(source) == XFORMERS_0_0_35


def test_torch_dtypes_are_accepted_too():
    import torch
    assert plan(DECODE, 64, torch.bfloat16, 64, XFORMERS_0_0_35) == (SPLITK, None)
