"""Greedy tokens and top-5 logprobs of the engine against transformers' LlamaForCausalLM."""
import pytest

from appliance.config.schema import EngineConfig
from appliance.engine.llm_engine import LLMEngine
from appliance.engine.sampling_params import SamplingParams
from tests.engine.helpers import assert_no_block_leaks, check_logprobs_close, hf_greedy, random_prompts

MAX_TOKENS = 12
LENGTHS = [1, 3, 5, 8, 13, 16, 17, 21, 31, 40, 50, 64]
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=5)


def run_and_compare(model_dir, prompts, cfg: EngineConfig, warmup=()):
    ref = hf_greedy(model_dir, prompts, MAX_TOKENS)
    engine = LLMEngine(model_dir, cfg)
    runner = engine.executor.runner
    uses_ours = runner.attn_backend.name == "cpu" and runner.model.lm_head.packed is not None
    wants_ours = cfg.cpu_kernels and cfg.device == "cpu"  # fp32 here; on CUDA (test_cuda) never ours
    assert uses_ours == wants_ours, "engine.cpu_kernels did not select the kernels it names"
    if warmup:
        engine.generate(list(warmup), GREEDY)
    outs = engine.generate(prompts, GREEDY)
    for i, ((ref_tokens, ref_lps), out) in enumerate(zip(ref, outs)):
        assert out.finished and out.finish_reason == "length"
        check_logprobs_close(ref_tokens, ref_lps, out.token_ids, out.logprobs, name=f"prompt {i}")
    assert_no_block_leaks(engine)
    return engine


def test_greedy_batch_matches_hf(llama_dir, kernels):
    run_and_compare(llama_dir, random_prompts(400, LENGTHS), EngineConfig(cpu_kernels=kernels, num_kv_blocks=256))


def test_sharded_checkpoint_with_tied_embeddings(sharded_tied_dir, kernels):
    import os
    assert os.path.exists(os.path.join(sharded_tied_dir, "model.safetensors.index.json"))
    run_and_compare(sharded_tied_dir, random_prompts(400, LENGTHS[:10], seed=3),
                    EngineConfig(cpu_kernels=kernels, num_kv_blocks=256))


def test_preemption_keeps_outputs_identical(llama_dir, kernels):
    # 12 blocks of 16 slots cannot hold all 12 sequences at once: the scheduler must preempt.
    engine = run_and_compare(llama_dir, random_prompts(400, LENGTHS, seed=4),
                             EngineConfig(cpu_kernels=kernels, num_kv_blocks=12, enable_prefix_caching=False))
    assert engine.stats()["num_preemptions"] > 0


def test_prefix_caching_keeps_outputs_identical(llama_dir, kernels):
    shared = random_prompts(400, [40], seed=5)[0]
    tails = random_prompts(400, [1, 2, 5, 9, 16, 20, 3, 7, 11, 30], seed=6)
    prompts = [shared + t for t in tails]
    engine = run_and_compare(llama_dir, prompts,
                             EngineConfig(cpu_kernels=kernels, num_kv_blocks=256, enable_prefix_caching=True),
                             warmup=[shared + [7]])
    stats = engine.stats()
    assert stats["prefix_cache_hit_tokens"] >= 2 * 16 * len(prompts)


def test_chunked_prefill_keeps_outputs_identical(llama_dir, kernels):
    engine = run_and_compare(llama_dir, random_prompts(400, LENGTHS, seed=7),
                             EngineConfig(cpu_kernels=kernels, num_kv_blocks=256, max_num_batched_tokens=16))
    assert engine.stats()["num_chunked_prefills"] > 0


def test_rope_scaling_matches_hf(rope_scaled_dir, kernels):
    # Prompts longer than original_max_position_embeddings (32) exercise the scaled frequencies.
    run_and_compare(rope_scaled_dir, random_prompts(400, [5, 33, 60, 100, 17, 80, 45, 2, 64, 90], seed=8),
                    EngineConfig(cpu_kernels=kernels, num_kv_blocks=128))


def test_unsupported_rope_type_is_a_clear_error():
    from appliance.engine.layers import rope_inv_freq
    with pytest.raises(ValueError, match="not supported"):
        rope_inv_freq(16, {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})


def test_seeded_sampling_survives_preemption(llama_dir, kernels):
    prompts = random_prompts(400, LENGTHS, seed=9)
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=i, max_tokens=MAX_TOKENS, ignore_eos=True)
              for i in range(len(prompts))]
    calm = LLMEngine(llama_dir, EngineConfig(cpu_kernels=kernels, num_kv_blocks=256)).generate(prompts, params)
    pressured = LLMEngine(llama_dir, EngineConfig(cpu_kernels=kernels, num_kv_blocks=12, max_num_batched_tokens=32))
    outs = pressured.generate(prompts, params)
    assert pressured.stats()["num_preemptions"] > 0
    assert [o.token_ids for o in outs] == [o.token_ids for o in calm]
    assert_no_block_leaks(pressured)


def test_two_engines_in_one_process_keep_their_own_kernel_choice(llama_dir, monkeypatch):
    """engine.cpu_kernels is each engine's own: building a second engine with them off leaves the first
    on them (it once was a process-wide switch that the last engine built set for all)."""
    from appliance.engine import cpu_kernels

    if not cpu_kernels.available():
        pytest.skip(f"CPU kernels unavailable: {cpu_kernels.unavailable_reason()}")
    ours = LLMEngine(llama_dir, EngineConfig(cpu_kernels=True, num_kv_blocks=64))
    torch_only = LLMEngine(llama_dir, EngineConfig(cpu_kernels=False, num_kv_blocks=64))  # built last
    calls = []
    real = cpu_kernels.rms_norm
    monkeypatch.setattr(cpu_kernels, "rms_norm", lambda *a: calls.append(1) or real(*a))
    prompts = random_prompts(400, LENGTHS[:6], seed=10)
    outputs = {}
    for name, engine, on in (("ours", ours, True), ("torch", torch_only, False)):
        runner = engine.executor.runner
        layers = [m for m in runner.model.modules() if isinstance(m, cpu_kernels.KernelLayer)]
        assert layers and all(m.use_cpu_kernels is on for m in layers)
        assert (runner.attn_backend.name == "cpu") is on and runner.sampler.use_cpu_kernels is on
        assert (runner.model.lm_head.packed is not None) is on
        calls.clear()
        outputs[name] = engine.generate(prompts, GREEDY)
        assert bool(calls) is on, f"{name}: our RMSNorm kernel ran {len(calls)} times"
    for i, (a, b) in enumerate(zip(outputs["torch"], outputs["ours"])):
        check_logprobs_close(a.token_ids, a.logprobs, b.token_ids, b.logprobs, name=f"prompt {i}")
