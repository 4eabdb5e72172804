"""One tokenizer and one context rule per chat pipeline: the engine's (`stages/engine_stage.py`)."""
import pytest

from appliance.config.compose import compose
from appliance.errors import ConfigError, InputError
from appliance.stages.build import build_pipeline
from appliance.stages.engine_stage import check_fits
from tests.chat.conftest import text_overrides


def _stages(pipeline):
    return {stage.id: stage for stage in pipeline.stages}


def test_prompt_stage_engine_and_responses_share_one_tokenizer(text_llama_dir):
    pipeline = build_pipeline(compose(text_overrides(text_llama_dir, "engine.max_model_len=300")))
    try:
        pipeline.setup()
        stages = _stages(pipeline)
        engine = stages["engine"].engine
        assert stages["chat_prompt"].tokenizer is engine.tokenizer
        assert stages["chat_responses"]._decode(engine.tokenizer.encode("a")[-1]).strip() == "a"
        assert stages["chat_responses"].shared.get("tokenizer", lambda: None) is engine.tokenizer
        assert stages["chat_prompt"].max_len == engine.max_model_len == 300
    finally:
        pipeline.close()


def test_a_context_past_the_models_limit_is_the_engines_error_not_clamped(text_llama_dir):
    pipeline = build_pipeline(compose(text_overrides(text_llama_dir, "engine.max_model_len=100000")))
    prompt_stage = _stages(pipeline)["chat_prompt"]
    with pytest.raises(ConfigError, match=r"engine.max_model_len=100000 exceeds the model's limit 512"):
        prompt_stage.setup()
    assert _stages(pipeline)["engine"].engine is None, "refused before the engine loads"


@pytest.mark.parametrize("prompt, limit, max_tokens, fragments", [
    (10, 10, None, ["x: the prompt is 10 tokens; the model's context is 10 tokens", "fix it"]),
    (9, 10, 2, ["max_tokens: the prompt is 9 tokens and max_tokens is 2, 11 in all", "at most 1"]),
])
def test_check_fits(prompt, limit, max_tokens, fragments):
    with pytest.raises(InputError) as info:
        check_fits(prompt, limit, "x", "fix it", max_tokens=max_tokens, param="x")
    for fragment in fragments:
        assert fragment in str(info.value)


@pytest.mark.parametrize("prompt, limit, max_tokens", [(9, 10, None), (9, 10, 1), (0, 1, None)])
def test_check_fits_accepts(prompt, limit, max_tokens):
    check_fits(prompt, limit, "x", "fix it", max_tokens=max_tokens)
