"""Beam search: the search's rules on hand-written logprobs, and the engine's answers against transformers'
`num_beams` on the shipped tiny LLaVA's language model."""
from pathlib import Path

import pytest
import torch

from appliance.engine.beam_search import Beam, BeamSearch, BeamSearchParams

EOS = 2
LLAVA_TINY = Path(__file__).resolve().parents[2] / "appliance" / "assets" / "models" / "llava_tiny"


def test_each_round_keeps_the_width_best_candidates_and_eos_candidates_finish():
    params = BeamSearchParams(width=2, max_tokens=3, length_penalty=1.0)
    search = BeamSearch(prompt_len=3, params=params, eos_token_ids={EOS})
    search.advance([{10: -0.1, 11: -0.5, EOS: -2.0, 12: -3.0}])
    assert [b.tokens for b in search.live] == [(10,), (11,)]
    assert search.finished == [Beam((EOS,), -2.0, "stop")]
    search.advance([{20: -1.0, EOS: -0.2}, {21: -0.1, 22: -0.2}])
    assert [b.tokens for b in search.live] == [(11, 21), (11, 22)]  # -0.6 and -0.7 beat 10, 20 at -1.1
    assert search.finished[-1] == Beam((10, EOS), pytest.approx(-0.3), "stop")
    assert not search.done
    search.advance([{30: -1.0}, {31: -1.0}])
    assert search.done


@pytest.mark.parametrize("length_penalty, winner", [
    (0.0, (10, EOS)),            # cumulative logprob alone: -0.3 beats -0.6
    (1.0, (10, EOS)),            # -0.3 / (3 + 1) beats -0.6 / (3 + 2)
    (20.0, (11, 21)),            # a long answer's length outweighs its logprob
], ids=["no-penalty", "default", "long-favoured"])
def test_answers_rank_by_logprob_over_length_counting_the_prompt_and_not_the_eos(length_penalty, winner):
    search = BeamSearch(prompt_len=3, params=BeamSearchParams(2, 2, length_penalty), eos_token_ids={EOS})
    search.advance([{10: -0.1, 11: -0.5}])
    search.advance([{EOS: -0.2, 20: -5.0}, {21: -0.1, 22: -5.0}])
    best = search.best()
    assert best[0].tokens == winner and len(best) == 2
    assert best[0].finish_reason == ("stop" if winner[-1] == EOS else "length")


@pytest.mark.parametrize("length_penalty", [1e300, -3.9e61])
def test_a_penalty_past_floats_range_ranks_without_failing(length_penalty):
    """length ** penalty overflows (every score 0) or underflows to 0 (every loss infinite): still an answer."""
    search = BeamSearch(prompt_len=3, params=BeamSearchParams(2, 2, length_penalty), eos_token_ids={EOS})
    search.advance([{10: -0.1, 11: -0.5}])
    search.advance([{EOS: -0.2, 20: -5.0}, {21: -0.1, 22: -5.0}])
    assert len(search.best()) == 2


def test_each_beam_proposes_enough_candidates_that_width_of_them_never_end():
    assert BeamSearch(3, BeamSearchParams(4, 8, 1.0), eos_token_ids={EOS}).candidates == 8
    assert BeamSearch(3, BeamSearchParams(4, 8, 1.0), eos_token_ids={EOS, 7, 9}).candidates == 16
    assert BeamSearch(3, BeamSearchParams(4, 8, 1.0, ignore_eos=True), eos_token_ids={EOS, 7}).candidates == 8


def test_ignore_eos_keeps_every_beam_running():
    params = BeamSearchParams(width=1, max_tokens=1, length_penalty=1.0, ignore_eos=True)
    search = BeamSearch(3, params, eos_token_ids={EOS})
    search.advance([{EOS: -0.1, 5: -1.0}])
    assert search.best() == [Beam((EOS,), -0.1, "length")]


def test_refuses_a_width_or_max_tokens_below_one():
    with pytest.raises(ValueError, match="width >= 1"):
        BeamSearchParams(width=0, max_tokens=4, length_penalty=1.0)


# ---- the engine against transformers ---------------------------------------------------------------

PROMPTS = ["USER: What color is the shape? ASSISTANT:", "USER: What shape is it? ASSISTANT:", "Hello", "the red"]


def run_beam_searches(engine, prompts, params):
    """Every prompt's search at once; per prompt, its answers' (token ids, finish reason), best first."""
    answer_ids = [[f"{p}-{k}" for k in range(params.width)] for p in range(len(prompts))]
    for prompt, ids in zip(prompts, answer_ids):
        engine.add_beam_search(prompt, params, ids)
    final = {}
    while engine.has_unfinished():
        final.update((out.request_id, out) for out in engine.step() if out.finished)
    return [[(final[i].token_ids, final[i].finish_reason) for i in ids] for ids in answer_ids]


@pytest.fixture(scope="module")
def tiny_llava():
    if not (LLAVA_TINY / "config.json").is_file():
        pytest.skip("appliance/assets/models/llava_tiny is not there (scripts/train_tiny_llava.py)")
    from transformers import AutoTokenizer, LlavaForConditionalGeneration

    from appliance.engine.config import EngineConfig
    from appliance.engine.llm_engine import LLMEngine

    engine = LLMEngine(str(LLAVA_TINY), EngineConfig(dtype="float32", num_kv_blocks=256))
    reference = LlavaForConditionalGeneration.from_pretrained(str(LLAVA_TINY), dtype=torch.float32).eval()
    yield engine, reference, AutoTokenizer.from_pretrained(str(LLAVA_TINY))
    engine.close()


@pytest.mark.parametrize("width", [2, 3])
@pytest.mark.parametrize("length_penalty", [1.0, 0.0])
def test_the_engine_answers_as_transformers_beam_search(tiny_llava, width, length_penalty):
    """Our answers (width of them, best first) equal transformers' num_beams=num_return_sequences=width,
    greedy, in fp32. vLLM's semantics (ours) keep every candidate that ends on EOS and rank them all at
    the end; transformers with early_stopping=True keeps the num_beams best finished ones and stops once
    it has them. Where every answer ends on EOS before max_tokens, as the tiny model's do, the two agree
    (transformers' "never" with a positive length penalty instead goes on for longer answers)."""
    engine, reference, tokenizer = tiny_llava
    prompts = [tokenizer(text).input_ids for text in PROMPTS]
    ours = run_beam_searches(engine, prompts, BeamSearchParams(width, max_tokens=12, length_penalty=length_penalty))
    pad = reference.generation_config.pad_token_id
    for prompt, answers in zip(prompts, ours):
        with torch.no_grad():
            out = reference.generate(torch.tensor([prompt]), num_beams=width, num_return_sequences=width,
                                     do_sample=False, max_new_tokens=12, length_penalty=length_penalty,
                                     early_stopping=True)
        expected = [[t for t in row.tolist()[len(prompt):] if t != pad] for row in out]
        assert [tokens for tokens, _ in answers] == expected
        assert all(reason == ("stop" if tokens[-1] == EOS else "length") for tokens, reason in answers)
    assert all(len({tuple(t) for t, _ in answers}) == width for answers in ours)  # distinct beams


def test_beams_share_the_prompts_blocks_and_an_abort_frees_every_beam(tiny_llava):
    engine, _, tokenizer = tiny_llava
    prompt = tokenizer("USER: What color is the shape? Tell me what you see in the picture. ASSISTANT:").input_ids
    before = engine.stats()
    run_beam_searches(engine, [prompt], BeamSearchParams(3, max_tokens=6, length_penalty=1.0))
    after = engine.stats()
    full_blocks = len(prompt) // engine.cfg.block_size
    assert full_blocks >= 1
    # every round after the first finds the prompt's full blocks cached
    hits = after["prefix_cache_hit_tokens"] - before["prefix_cache_hit_tokens"]
    assert hits >= 5 * full_blocks * engine.cfg.block_size
    engine.add_beam_search(prompt, BeamSearchParams(2, max_tokens=8, length_penalty=1.0), ["x", "y"])
    engine.step()
    engine.abort("y")
    assert not engine.has_unfinished() and not engine.beams.runs and not engine.beams.by_round
    assert engine.stats()["kv_blocks_free"] == engine.stats()["kv_blocks_total"]


def test_a_search_whose_longest_beams_cannot_fit_is_refused_before_it_starts():
    if not (LLAVA_TINY / "config.json").is_file():
        pytest.skip("appliance/assets/models/llava_tiny is not there (scripts/train_tiny_llava.py)")
    from appliance.engine.config import EngineConfig
    from appliance.engine.llm_engine import LLMEngine
    from appliance.engine.sampling_params import FieldError

    prompt = list(range(3, 23))  # 20 tokens
    with LLMEngine(str(LLAVA_TINY), EngineConfig(dtype="float32", num_kv_blocks=4, block_size=16)) as engine:
        with pytest.raises(ValueError, match="needs up to 5 KV blocks"):  # 20 + 60 tokens in blocks of 16
            engine.add_beam_search(prompt, BeamSearchParams(2, max_tokens=60, length_penalty=1.0), ["a", "b"])
        assert not engine.has_unfinished() and not engine.beams.runs
    with LLMEngine(str(LLAVA_TINY), EngineConfig(dtype="float32", num_kv_blocks=8, max_model_len=32)) as engine:
        with pytest.raises(FieldError, match="context is 32 tokens") as info:
            engine.add_beam_search(prompt, BeamSearchParams(2, max_tokens=13, length_penalty=1.0), ["a", "b"])
        assert info.value.field == "max_tokens" and not engine.beams.runs
