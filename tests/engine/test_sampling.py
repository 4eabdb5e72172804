"""Sampling parameters, stop conditions, abort and incremental detokenization through the engine."""
import pytest
import torch

from appliance.config.schema import EngineConfig
from appliance.engine.detokenizer import IncrementalDetokenizer
from appliance.engine.llm_engine import LLMEngine
from appliance.engine.sampler import Sampler, logprob_entries
from appliance.engine.sampling_params import SamplingParams
from tests.engine.helpers import assert_no_block_leaks, random_prompts


@pytest.fixture(scope="module")
def engine(llama_dir):
    eng = LLMEngine(llama_dir, EngineConfig(num_kv_blocks=256, seed=123))
    yield eng
    assert_no_block_leaks(eng)


PROMPTS = random_prompts(400, [4, 9, 17, 30, 6], seed=11)


def sample(**kw):
    return SamplingParams(**{"temperature": 1.0, "max_tokens": 16, "ignore_eos": True, **kw})


def test_seed_reproducible_regardless_of_batch(engine):
    alone = engine.generate([PROMPTS[0]], sample(seed=42))[0].token_ids
    batched = engine.generate(PROMPTS, [sample(seed=42)] + [sample(seed=i) for i in range(1, 5)])
    assert batched[0].token_ids == alone
    other = engine.generate([PROMPTS[0]] * 3, [sample(seed=s) for s in (43, 44, 45)])
    assert any(o.token_ids != alone for o in other), "different seeds should sample differently"


def test_unseeded_requests_differ_but_engine_seed_is_reproducible(llama_dir, engine):
    a = engine.generate([PROMPTS[1]] * 2, sample())
    assert a[0].token_ids != a[1].token_ids
    runs = [LLMEngine(llama_dir, EngineConfig(num_kv_blocks=64, seed=7)).generate([PROMPTS[1]] * 2, sample())
            for _ in range(2)]
    assert [o.token_ids for o in runs[0]] == [o.token_ids for o in runs[1]]


def test_top_k_one_equals_greedy(engine):
    greedy = engine.generate(PROMPTS, sample(temperature=0))
    top1 = engine.generate(PROMPTS, [sample(top_k=1, temperature=1.5, seed=i) for i in range(len(PROMPTS))])
    assert [o.token_ids for o in top1] == [o.token_ids for o in greedy]


def test_tiny_top_p_equals_greedy(engine):
    greedy = engine.generate(PROMPTS, sample(temperature=0))
    top_p = engine.generate(PROMPTS, sample(top_p=1e-6, seed=3))
    assert [o.token_ids for o in top_p] == [o.token_ids for o in greedy]


def test_max_tokens_and_logprobs(engine):
    outs = engine.generate(PROMPTS, [sample(max_tokens=n, logprobs=3, seed=n) for n in (1, 2, 5, 7, 11)])
    for n, o in zip((1, 2, 5, 7, 11), outs):
        assert len(o.token_ids) == n and o.finish_reason == "length"
        assert len(o.logprobs) == n
        for tok, lps in zip(o.token_ids, o.logprobs):
            assert next(iter(lps)) == tok  # sampled token first
            assert 3 <= len(lps) <= 4 and all(lp <= 0 for lp in lps.values())


def test_stop_token_ids(engine):
    full = engine.generate([PROMPTS[2]], sample(temperature=0))[0]
    stop_tok = full.token_ids[5]
    first = full.token_ids.index(stop_tok)
    out = engine.generate([PROMPTS[2]], sample(temperature=0, stop_token_ids=[stop_tok]))[0]
    assert out.token_ids == full.token_ids[:first + 1] and out.finish_reason == "stop"


def test_eos_and_ignore_eos(engine):
    full = engine.generate([PROMPTS[3]], sample(temperature=0))[0]
    saved = engine.eos_token_ids
    engine.eos_token_ids = {full.token_ids[4]}  # pretend this token is the model's EOS
    try:
        first = full.token_ids.index(full.token_ids[4])
        stopped = engine.generate([PROMPTS[3]], sample(temperature=0, ignore_eos=False))[0]
        ignored = engine.generate([PROMPTS[3]], sample(temperature=0, ignore_eos=True))[0]
    finally:
        engine.eos_token_ids = saved
    assert stopped.token_ids == full.token_ids[:first + 1] and stopped.finish_reason == "stop"
    assert ignored.token_ids == full.token_ids and ignored.finish_reason == "length"


def test_min_tokens_suppresses_eos_stop_ids_and_stop_strings(engine):
    full = engine.generate([PROMPTS[3]], sample(temperature=0, max_tokens=12))[0]
    eos, stop_id = full.token_ids[1], full.token_ids[2]
    saved = engine.eos_token_ids
    engine.eos_token_ids = {eos}
    try:
        early = engine.generate([PROMPTS[3]], sample(temperature=0, max_tokens=12, ignore_eos=False))[0]
        held = engine.generate([PROMPTS[3]], sample(temperature=0, max_tokens=12, ignore_eos=False,
                                                    stop_token_ids=[stop_id], min_tokens=6, logprobs=1))[0]
    finally:
        engine.eos_token_ids = saved
    assert early.token_ids == full.token_ids[:2] and early.finish_reason == "stop"
    assert len(held.token_ids) >= 6
    assert eos not in held.token_ids[:6] and stop_id not in held.token_ids[:6]
    # The first token was not masked (it is neither id), so it matches the unmasked greedy choice.
    assert held.token_ids[0] == full.token_ids[0]
    # Logprobs stay those of the raw logits: at step 2 the raw argmax (eos) still tops the list.
    assert held.token_ids[1] != eos and held.logprobs[1][eos] > held.logprobs[1][held.token_ids[1]]
    text = full.text
    stop = text[:2]
    out = engine.generate([PROMPTS[3]], sample(temperature=0, max_tokens=12, stop=[stop], min_tokens=4))[0]
    assert len(out.token_ids) >= 4


def test_min_tokens_is_checked():
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=4, min_tokens=5)


def test_stop_string_truncates_text(engine):
    full = engine.generate([PROMPTS[4]], sample(temperature=0, max_tokens=24))[0]
    text = full.text
    assert len(text) > 6
    stop = text[3:6]
    out = engine.generate([PROMPTS[4]], sample(temperature=0, max_tokens=24, stop=[stop]))[0]
    assert out.finish_reason == "stop"
    assert out.text == text[: text.index(stop)]


def test_streamed_deltas_add_up_to_text(engine):
    engine.add_request(PROMPTS[0], sample(seed=5, max_tokens=20), request_id="stream")
    deltas, final = [], None
    while engine.has_unfinished():
        for o in engine.step():
            deltas.append(o.new_text)
            final = o
    assert final.finished and "".join(deltas) == final.text
    assert final.text == engine.tokenizer.decode(final.token_ids, skip_special_tokens=True)


def test_abort(engine):
    engine.add_request(PROMPTS[0], sample(max_tokens=50), request_id="a")
    engine.add_request(PROMPTS[1], sample(max_tokens=5), request_id="b")
    engine.step()
    engine.abort("a")
    finished = []
    while engine.has_unfinished():
        finished += [o.request_id for o in engine.step() if o.finished]
    assert finished == ["b"]


def test_invalid_params_are_clear():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)


def test_request_too_long_for_cache_is_rejected(llama_dir):
    eng = LLMEngine(llama_dir, EngineConfig(num_kv_blocks=2))
    with pytest.raises(ValueError, match="KV blocks"):
        eng.add_request(list(range(3, 40)), SamplingParams(max_tokens=10))
    assert not eng.has_unfinished()


def test_multibyte_detokenization(engine):
    tok = engine.tokenizer
    text = "héllo 日本語 😀🚀 €∑ ça"
    ids = tok.encode(text)
    partial = [i for i in ids if "\ufffd" in tok.decode([i])]
    assert partial, "the test tokenizer must split some multi-byte characters across tokens"
    detok = IncrementalDetokenizer(tok, [5, 6])
    deltas = [detok.add(i) for i in ids]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == text == detok.text


def test_stop_string_spanning_tokens():
    class CharTok:  # one character per token
        def decode(self, ids, **kw):
            return "".join(chr(i) for i in ids)

    detok = IncrementalDetokenizer(CharTok(), [], stop=["cd"])
    deltas = [detok.add(ord(c)) for c in "abcdef"]
    assert detok.stopped and detok.text == "ab"
    assert "".join(deltas).startswith("ab")


def test_from_config_composes_engine_group(llama_dir):
    from omegaconf import OmegaConf

    from appliance.config.schema import AppConfig
    app = OmegaConf.merge(OmegaConf.structured(AppConfig), {
        "pipeline": {"name": "x", "inputs": [], "stages": {}},
        "model": {"name": "tiny", "architecture": "LlamaForCausalLM", "path": llama_dir},
        "engine": {"num_kv_blocks": 32, "max_num_seqs": 4}})
    engine = LLMEngine.from_config(app)
    assert engine.block_manager.num_blocks == 32 and engine.scheduler.max_num_seqs == 4
    out = engine.generate(["héllo wörld"], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))[0]
    assert len(out.token_ids) == 3
    assert_no_block_leaks(engine)


def test_no_max_tokens_runs_to_the_end_of_the_context(llama_dir):
    with LLMEngine(llama_dir, EngineConfig(num_kv_blocks=64, max_model_len=40)) as engine:
        prompt = [PROMPTS[0]]
        (out,) = engine.generate(prompt, [SamplingParams(temperature=0, ignore_eos=True)])
        assert out.finish_reason == "length" and len(prompt[0]) + len(out.token_ids) == 40


def test_running_ids_are_the_requests_scheduled_now(llama_dir):
    with LLMEngine(llama_dir, EngineConfig(num_kv_blocks=64, max_num_seqs=2)) as engine:
        ids = [engine.add_request(p, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
               for p in random_prompts(400, [5, 6, 7], seed=3)]
        assert engine.running_ids() == []
        engine.step()
        assert engine.running_ids() == ids[:2], "max_num_seqs=2: the third waits"
        engine.abort(ids[0])
        assert engine.running_ids() == [ids[1]]


def test_siblings_share_a_prompt_computed_once(llama_dir):
    prompt = random_prompts(400, [40], seed=12)[0]  # 2 full blocks of 16 and a partial one

    def answers(share: bool):
        """Four answers to the prompt (greedy, then three seeded), and the prefix-cache hits."""
        engine = LLMEngine(llama_dir, EngineConfig(num_kv_blocks=64))
        first = engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
        ids = [first] + [engine.add_request(prompt, SamplingParams(temperature=0.8, seed=i, max_tokens=6,
                                                                    ignore_eos=True), sibling=first if share else None)
                         for i in range(3)]
        outs = {}
        while engine.has_unfinished():
            outs.update({o.request_id: o for o in engine.step() if o.finished})
        assert_no_block_leaks(engine)
        return [outs[i].token_ids for i in ids], engine.stats()["prefix_cache_hit_tokens"]

    together, together_hits = answers(share=False)
    siblings, sibling_hits = answers(share=True)
    assert together_hits == 0, "admitted together, every copy computed the prompt"
    assert sibling_hits == 3 * 32, "each sibling found the first one's two full prompt blocks"
    assert siblings == together


@pytest.mark.parametrize("engine_config", [
    dict(num_kv_blocks=64),
    dict(num_kv_blocks=64, max_num_batched_tokens=16),  # the prompts arrive in chunks
    dict(num_kv_blocks=6, max_num_batched_tokens=32, enable_prefix_caching=False),  # preempted
], ids=["whole", "chunked", "preempted"])
def test_prompt_logprobs_match_transformers(llama_dir, engine_config):
    import torch
    from transformers import LlamaForCausalLM

    prompts = random_prompts(400, [1, 9, 40, 23], seed=13)
    model = LlamaForCausalLM.from_pretrained(llama_dir, dtype=torch.float32).eval()
    engine = LLMEngine(llama_dir, EngineConfig(**engine_config))
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, prompt_logprobs=2)
    outs = engine.generate(prompts + prompts[2:3], params)  # the repeat would hit the prefix cache
    for prompt, out in zip(prompts + prompts[2:3], outs):
        with torch.no_grad():
            reference = torch.log_softmax(model(torch.tensor([prompt])).logits[0].float(), dim=-1)
        assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
        for position, entry in enumerate(out.prompt_logprobs[1:], start=1):
            token = prompt[position]
            assert abs(entry[token] - reference[position - 1, token].item()) < 1e-3
            top = reference[position - 1].topk(2).indices.tolist()
            assert set(top) <= set(entry) and len(entry) <= 3
    if engine_config.get("num_kv_blocks") == 6:
        assert engine.stats()["num_preemptions"] > 0
    assert_no_block_leaks(engine)


def test_logprob_entries_put_the_token_first_then_the_top_n_once():
    """One entry shape for sampled tokens and prompt tokens (sampler.logprob_entries)."""
    logprobs = torch.log_softmax(torch.tensor([[3.0, 2.0, 1.0, 0.0], [0.0, 1.0, 2.0, 3.0]]), dim=-1)
    lp = logprobs.tolist()
    entries = logprob_entries(logprobs, [2, 3], [2, None])
    assert entries[1] is None  # that row asked for no logprobs
    assert list(entries[0].items()) == [(2, lp[0][2]), (0, lp[0][0]), (1, lp[0][1])]
    # the token among the top N is not repeated; N=0 is the token alone
    assert list(logprob_entries(logprobs, [3, 0], [1, 0])[0].items()) == [(3, lp[0][3]), (0, lp[0][0])]
    assert logprob_entries(logprobs, [0, 3], [2, 2])[1] == {3: lp[1][3], 2: lp[1][2]}
    assert logprob_entries(logprobs, [3, 0], [0, 0]) == [{3: lp[0][3]}, {0: lp[1][0]}]
    assert Sampler.score(logprobs.exp().log(), [2, 3], 2)[0] == pytest.approx(entries[0])
