"""TP=2 over gloo gives TP=1's greedy tokens; a dead worker raises instead of hanging."""
import os
import signal
import time

import pytest

from appliance.config.schema import EngineConfig
from appliance.engine.llm_engine import LLMEngine
from appliance.engine.sampling_params import SamplingParams
from appliance.engine.tp_executor import WorkerDiedError
from tests.engine.helpers import assert_no_block_leaks, check_logprobs_close, random_prompts

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=5)


@pytest.fixture(scope="module")
def tp_engine(sharded_tied_dir):
    # Tied embeddings + sharded checkpoint: exercises the vocab-parallel embedding and LM head.
    engine = LLMEngine(sharded_tied_dir, EngineConfig(num_kv_blocks=64, tensor_parallel_size=2))
    yield engine
    engine.close()


def test_tp2_matches_tp1(sharded_tied_dir, tp_engine):
    prompts = random_prompts(400, [3, 17, 30, 8, 1, 45], seed=21)
    single = LLMEngine(sharded_tied_dir, EngineConfig(num_kv_blocks=64)).generate(prompts, GREEDY)
    outs = tp_engine.generate(prompts, GREEDY)
    for i, (a, b) in enumerate(zip(single, outs)):
        check_logprobs_close(a.token_ids, a.logprobs, b.token_ids, b.logprobs, name=f"prompt {i}")
    assert_no_block_leaks(tp_engine)


def test_killed_worker_raises_clear_error(sharded_tied_dir):
    engine = LLMEngine(sharded_tied_dir, EngineConfig(num_kv_blocks=64, tensor_parallel_size=2))
    worker = engine.executor.procs[0]
    engine.generate([[5, 6, 7]], GREEDY)
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(timeout=10)
    engine.add_request([5, 6, 7, 8], GREEDY)
    start = time.monotonic()
    with pytest.raises(WorkerDiedError, match="rank 1"):
        while engine.has_unfinished():
            engine.step()
    assert time.monotonic() - start < 30
    with pytest.raises(WorkerDiedError, match="shut down"):
        engine.step()


def test_hung_worker_times_out(sharded_tied_dir):
    engine = LLMEngine(sharded_tied_dir, EngineConfig(num_kv_blocks=64, tensor_parallel_size=2), tp_timeout_s=5)
    worker = engine.executor.procs[0]
    os.kill(worker.pid, signal.SIGSTOP)  # alive but unresponsive: only the collective timeout can tell
    try:
        engine.add_request([5, 6, 7, 8], GREEDY)
        start = time.monotonic()
        with pytest.raises(WorkerDiedError, match="step failed"):
            while engine.has_unfinished():
                engine.step()
        assert time.monotonic() - start < 30
    finally:
        if worker.is_alive():
            os.kill(worker.pid, signal.SIGKILL)
        worker.join(timeout=10)


def test_indivisible_tp_size_is_a_clear_error(sharded_tied_dir):
    with pytest.raises(ValueError, match="not divisible by tensor_parallel_size"):
        LLMEngine(sharded_tied_dir, EngineConfig(num_kv_blocks=8, tensor_parallel_size=3))
