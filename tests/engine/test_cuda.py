"""The CUDA paths: the engine on a GPU, the xformers backend, NCCL tensor parallelism and both
pipelines on CUDA. Skipped without a GPU; on a CUDA machine, `scripts/gpu_checks.sh run` runs them
with the other GPU checks (docs/engine.md, "GPU checks")."""
import importlib.util
import logging

import numpy as np
import pytest
import torch

from appliance.config.schema import AttentionBackend, EngineConfig
from appliance.engine.attention_select import select_backend
from appliance.engine.attention_geometry import AttentionGeometry
from appliance.engine.llm_engine import LLMEngine
from tests.conftest import REPO, run_cli
from tests.engine.helpers import assert_no_block_leaks, check_logprobs_close, random_prompts
from tests.engine.test_llama_parity import GREEDY, LENGTHS, run_and_compare

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
needs_xformers = pytest.mark.skipif(importlib.util.find_spec("xformers") is None, reason="needs xformers")
SAMPLES = REPO / "appliance" / "assets" / "samples"
CUDA = torch.device("cuda")
# The test Llama's attention (4 heads, 2 KV heads, head dim 16) at the block size xformers needs.
GEOMETRY = AttentionGeometry(num_heads=4, num_kv_heads=2, head_dim=16, block_size=64)

# Scheduler situations that change what the kernels see: chunked prefill gives queries an offset into
# their context (mixed steps), the prefix cache starts prompts from cached blocks, preemption recomputes.
SITUATIONS = {
    "plain": dict(num_kv_blocks=64),
    "chunked": dict(num_kv_blocks=64, max_num_batched_tokens=16),
    "prefix": dict(num_kv_blocks=64, enable_prefix_caching=True),
    "preempt": dict(num_kv_blocks=4, enable_prefix_caching=False),
}


@pytest.fixture(scope="module")
def xformers_reason():
    """None when the xformers backend passes its start-up probe on this GPU, else the reason."""
    try:
        select_backend(AttentionBackend.xformers, CUDA, torch.float16, GEOMETRY)
    except ValueError as e:
        return str(e)
    return None


def test_torch_backend_on_cuda_matches_hf_in_fp32(llama_dir):
    run_and_compare(llama_dir, random_prompts(400, LENGTHS),
                    EngineConfig(num_kv_blocks=256, device="cuda", attention_backend="torch"))


@needs_xformers
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_xformers_probe_passes_on_this_gpu(xformers_reason, dtype):
    """Every step kind runs and agrees with the torch backend (else: the reason, e.g. no kernel)."""
    if dtype == torch.float16:
        assert xformers_reason is None, xformers_reason
    else:
        select_backend(AttentionBackend.xformers, CUDA, dtype, GEOMETRY)


@needs_xformers
def test_auto_takes_xformers_only_where_it_runs(xformers_reason, caplog):
    with caplog.at_level(logging.INFO, logger="appliance.engine.attention"):
        at_64 = select_backend(AttentionBackend.auto, CUDA, torch.bfloat16, GEOMETRY)
        at_16 = select_backend(AttentionBackend.auto, CUDA, torch.bfloat16, AttentionGeometry(4, 2, 16, 16))
    assert at_64 == ("xformers" if xformers_reason is None else "torch")
    assert at_16 == "torch" and "engine.block_size=16" in caplog.text


@needs_xformers
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("situation", sorted(SITUATIONS))
def test_xformers_backend_matches_torch_backend(llama_dir, xformers_reason, situation, dtype):
    if xformers_reason is not None:
        pytest.skip(f"xformers cannot run here (test_xformers_probe_passes_on_this_gpu): {xformers_reason}")
    prompts = random_prompts(400, LENGTHS)
    if situation == "prefix":
        shared = random_prompts(400, [70], seed=5)[0]  # more than one 64-token block
        prompts = [shared + p for p in prompts[:6]]
    outs = {}
    for backend in ("torch", "xformers"):
        engine = LLMEngine(llama_dir, EngineConfig(device="cuda", dtype=dtype, block_size=64,
                                                   attention_backend=backend, **SITUATIONS[situation]))
        assert engine.executor.runner.attn_backend.name == backend
        if situation == "prefix":
            engine.generate(prompts[:1], GREEDY)  # the shared prefix is cached before the batch
        outs[backend] = engine.generate(prompts, GREEDY)
        stats = engine.stats()
        assert_no_block_leaks(engine)
    if situation == "preempt":
        assert stats["num_preemptions"] > 0
    if situation == "prefix":
        assert stats["prefix_cache_hit_tokens"] >= 64
    for i, (a, b) in enumerate(zip(outs["torch"], outs["xformers"])):
        # Same weights and dtype; only the attention kernel differs, so half-precision rounding is the
        # tolerance (bf16 keeps 8 bits of mantissa, fp16 11).
        tol = 0.05 if dtype == "float16" else 0.15
        check_logprobs_close(a.token_ids, a.logprobs, b.token_ids, b.logprobs, atol=tol, tie=tol,
                             name=f"{situation} {dtype} prompt {i}")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_tp2_over_nccl_matches_tp1(sharded_tied_dir):
    prompts = random_prompts(400, [3, 17, 30, 8, 1, 45], seed=21)
    single = LLMEngine(sharded_tied_dir, EngineConfig(num_kv_blocks=64, device="cuda")).generate(prompts, GREEDY)
    engine = LLMEngine(sharded_tied_dir, EngineConfig(num_kv_blocks=64, device="cuda", tensor_parallel_size=2))
    try:
        for i, (a, b) in enumerate(zip(single, engine.generate(prompts, GREEDY))):
            check_logprobs_close(a.token_ids, a.logprobs, b.token_ids, b.logprobs, name=f"prompt {i}")
    finally:
        engine.close()


def test_llava_chat_with_engine_cuda_answers_like_on_cpu():
    """The shipped `engine=cuda` group (bf16, block 64, auto: xformers where its probe passes)."""
    args = ("run", "pipeline=llava_chat", f"input={SAMPLES / 'orange_star.png'}", "prompt=What color is the shape?",
            "log_level=INFO")
    gpu = run_cli(*args, "engine=cuda")
    assert gpu.returncode == 0, gpu.stderr
    assert "orange" in gpu.stdout.lower(), gpu.stdout
    print(f"llava_chat engine=cuda: {gpu.stdout.strip()!r}; attention log: "
          f"{[line for line in gpu.stderr.splitlines() if 'attention' in line]}")


def test_prithvi_flood_on_cuda_matches_cpu(tmp_path):
    """Prithvi runs on the pool engine: `engine=cuda` is a generate group, so the device is set."""
    import rasterio

    masks = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / f"{device}.tif"
        result = run_cli("run", "pipeline=prithvi_flood", f"input={SAMPLES / 'flood_sample.tif'}", f"output={out}",
                         f"engine.device={device}")
        assert result.returncode == 0, result.stderr
        with rasterio.open(out) as src:
            masks[device] = src.read(1)
    agree = np.mean(masks["cpu"] == masks["cuda"])
    assert agree > 0.999, f"CUDA mask agrees with the CPU mask on {agree:.4%} of pixels"
