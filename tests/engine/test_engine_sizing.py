"""The engines apply memory_plan at start: the dtype and KV size they settle, what they log, and the
refusal of a model that cannot fit, before any weight loads (the CLI: one line, exit 2)."""
import logging

import pytest
import torch

from appliance.config.schema import EngineConfig
from appliance.engine.host import Host
from appliance.engine.llm_engine import LLMEngine
from appliance.engine.memory_plan import GIB
from appliance.errors import ConfigError
from tests.conftest import TINY_PRITHVI, assert_user_error, run_cli
from tests.servers import LLAVA_TINY

AVX2 = frozenset({"avx2"})


def test_defaults_settle_dtype_and_kv_from_the_checkpoint_and_log_them(caplog):
    with caplog.at_level(logging.INFO, logger="appliance.engine"):
        engine = LLMEngine(str(LLAVA_TINY), EngineConfig(max_num_seqs=4, max_model_len=256),
                           host=Host(AVX2, 16 * GIB, 16 * GIB))
    assert engine.cfg.dtype.value == "float32"  # the embedded model is fp32
    runner = engine.executor.runner
    assert next(runner.model.parameters()).dtype == torch.float32
    # Room to spare: the cache holds what 4 sequences of 256 tokens can use, no more.
    assert runner.num_kv_blocks * engine.cfg.block_size == 4 * 256
    text = caplog.text
    assert "engine.dtype: float32 (auto: the checkpoint's float32)" in text
    assert f"KV cache: 1024 tokens ({runner.num_kv_blocks} blocks of 16;" in text


def test_a_model_that_cannot_fit_is_refused_before_loading(monkeypatch):
    from appliance.engine import llm_engine

    def never(*args, **kwargs):
        raise AssertionError("the tokenizer or weights were loaded before the refusal")

    monkeypatch.setattr(llm_engine, "load_tokenizer", never)
    monkeypatch.setattr(llm_engine, "make_executor", never)
    with pytest.raises(ConfigError, match=r"does not fit: it needs .* but this machine has 0\.1 GiB available"):
        LLMEngine(str(LLAVA_TINY), EngineConfig(), host=Host(AVX2, GIB // 10, GIB // 10))


def test_pool_engine_is_refused_before_loading(tiny_prithvi_checkpoint):
    from appliance.config.compose import compose
    from appliance.engine.pool_engine import PoolEngine

    cfg = compose(["pipeline=prithvi_flood", *TINY_PRITHVI, f"model.checkpoint={tiny_prithvi_checkpoint}"])
    with pytest.raises(ConfigError, match=r"of weights in float32 \+ 1\.0 GiB runtime reserve\) but this machine has"):
        PoolEngine.from_config(cfg, host=Host(AVX2, 1000, 1000))
    engine = PoolEngine.from_config(cfg, host=Host(AVX2, 8 * GIB, 8 * GIB))
    assert engine.dtype == torch.float32


def test_cli_refusal_is_one_line_exit_2(tmp_path):
    from PIL import Image

    Image.new("RGB", (32, 32), "red").save(tmp_path / "red.png")
    result = run_cli("run", "pipeline=llava_chat", "plugins=[appliance.stages.chat]", f"input={tmp_path / 'red.png'}",
                     "prompt=What color?", "engine.memory_budget_bytes=100000000")
    assert_user_error(result, "does not fit: it needs", "but this machine has 0.1 GiB available")
