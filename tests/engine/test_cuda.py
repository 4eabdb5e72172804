"""The CUDA paths: the engine on a GPU, the xformers paged-attention backend, NCCL tensor parallelism
and both pipelines with `engine=cuda`. Skipped without a GPU; `scripts/gpu_checks.sh` runs them on a
lent device (docs/engine.md, "GPU checks")."""
import importlib.util

import numpy as np
import pytest
import torch

from appliance.config.schema import EngineConfig
from appliance.engine.llm_engine import LLMEngine
from tests.conftest import REPO, run_cli
from tests.engine.helpers import assert_no_block_leaks, check_logprobs_close, random_prompts
from tests.engine.test_llama_parity import GREEDY, LENGTHS, run_and_compare

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
needs_xformers = pytest.mark.skipif(importlib.util.find_spec("xformers") is None, reason="needs xformers")
SAMPLES = REPO / "appliance" / "assets" / "samples"

# Scheduler situations that change what the paged kernel sees: chunked prefill gives queries an offset
# into their context, the prefix cache starts prompts from cached blocks, preemption recomputes.
SITUATIONS = {
    "plain": dict(num_kv_blocks=256),
    "chunked": dict(num_kv_blocks=256, max_num_batched_tokens=16),
    "prefix": dict(num_kv_blocks=256, enable_prefix_caching=True),
    "preempt": dict(num_kv_blocks=12, enable_prefix_caching=False),
}


def test_torch_backend_on_cuda_matches_hf_in_fp32(llama_dir):
    run_and_compare(llama_dir, random_prompts(400, LENGTHS),
                    EngineConfig(num_kv_blocks=256, device="cuda", attention_backend="torch"))


@needs_xformers
@pytest.mark.parametrize("situation", sorted(SITUATIONS))
def test_xformers_backend_matches_torch_backend_in_fp16(llama_dir, situation):
    prompts = random_prompts(400, LENGTHS)
    if situation == "prefix":
        shared = random_prompts(400, [40], seed=5)[0]
        prompts = [shared + p for p in prompts[:6]]
    outs = {}
    for backend in ("torch", "xformers"):
        engine = LLMEngine(llama_dir, EngineConfig(device="cuda", dtype="float16", attention_backend=backend,
                                                   **SITUATIONS[situation]))
        if situation == "prefix":
            engine.generate(prompts[:1], GREEDY)  # the shared prefix is cached before the batch
        outs[backend] = engine.generate(prompts, GREEDY)
        assert_no_block_leaks(engine)
    assert outs["xformers"][0].finish_reason == "length"
    for i, (a, b) in enumerate(zip(outs["torch"], outs["xformers"])):
        # Same weights and dtype; only the attention kernel differs, so fp16 rounding is the tolerance.
        check_logprobs_close(a.token_ids, a.logprobs, b.token_ids, b.logprobs, atol=0.05, tie=0.05,
                             name=f"{situation} prompt {i}")


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
    """The shipped `engine=cuda` group (bf16, xformers when installed) on the embedded tiny LLaVA."""
    args = ("run", "pipeline=llava_chat", f"input={SAMPLES / 'orange_star.png'}", "prompt=What color is the shape?")
    gpu = run_cli(*args, "engine=cuda")
    assert gpu.returncode == 0, gpu.stderr
    assert "orange" in gpu.stdout.lower(), gpu.stdout


def test_prithvi_flood_on_cuda_matches_cpu(tmp_path):
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
