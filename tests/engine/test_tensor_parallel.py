"""TP=2 over gloo gives TP=1's greedy tokens; a worker that dies, hangs or raises makes rank 0 raise
RankDiedError (naming the rank and its error) instead of hanging; the NCCL and device wiring."""
import datetime
import os
import signal
import time

import pytest
import torch
import torch.distributed as dist

from appliance.config.schema import EngineConfig
from appliance.engine import parallel, tp_executor
from appliance.engine.llm_engine import LLMEngine
from appliance.engine.parallel import make_group, rank_device
from appliance.engine.sampling_params import SamplingParams
from appliance.engine.tp_executor import RankDiedError, wait_watching
from tests.engine import tp_faults
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


def test_tp2_structured_output_matches_tp1(sharded_tied_dir, tp_engine):
    from appliance.engine.structured_output import StructuredOutput

    prompts = random_prompts(400, [3, 17, 30], seed=22)
    regex = StructuredOutput("regex", r"[a-z]{2,6}( [a-z]{2,6}){1,3}\.")
    params = [SamplingParams(temperature=t, seed=i, max_tokens=40, structured=regex)
              for i, t in enumerate((0.0, 1.0, 1.0))]
    single = LLMEngine(sharded_tied_dir, EngineConfig(num_kv_blocks=64)).generate(prompts, params)
    outs = tp_engine.generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in single]
    assert all(o.finish_reason == "stop" and o.text.endswith(".") for o in outs)
    assert_no_block_leaks(tp_engine)


def test_killed_worker_raises_clear_error(sharded_tied_dir):
    engine = LLMEngine(sharded_tied_dir, EngineConfig(num_kv_blocks=64, tensor_parallel_size=2))
    worker = engine.executor.procs[0]
    engine.generate([[5, 6, 7]], GREEDY)
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(timeout=10)
    engine.add_request([5, 6, 7, 8], GREEDY)
    start = time.monotonic()
    with pytest.raises(RankDiedError, match="rank 1"):
        while engine.has_unfinished():
            engine.step()
    assert time.monotonic() - start < 30
    with pytest.raises(RankDiedError, match="shut down"):
        engine.step()


def test_hung_worker_times_out(sharded_tied_dir):
    engine = LLMEngine(sharded_tied_dir, EngineConfig(num_kv_blocks=64, tensor_parallel_size=2), tp_timeout_s=5)
    worker = engine.executor.procs[0]
    os.kill(worker.pid, signal.SIGSTOP)  # alive but unresponsive: only the collective timeout can tell
    try:
        engine.add_request([5, 6, 7, 8], GREEDY)
        start = time.monotonic()
        with pytest.raises(RankDiedError, match="step failed"):
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


@pytest.mark.parametrize("worker", ["worker_raising_before_step_3", "worker_raising_mid_forward"])
def test_worker_that_raises_mid_run_reaches_rank_0(sharded_tied_dir, monkeypatch, worker):
    monkeypatch.setattr(tp_executor, "rank_main", getattr(tp_faults, worker))
    timeout_s = 60
    engine = LLMEngine(sharded_tied_dir, EngineConfig(num_kv_blocks=64, tensor_parallel_size=2),
                       tp_timeout_s=timeout_s)
    worker_proc = engine.executor.procs[0]
    engine.add_request([5, 6, 7, 8], GREEDY)
    start = time.monotonic()
    with pytest.raises(RankDiedError, match="tensor-parallel rank 1 failed: RuntimeError: injected fault") as err:
        while engine.has_unfinished():
            engine.step()
    assert time.monotonic() - start < timeout_s / 2  # the report, not the collective timeout
    assert "worker traceback" in str(err.value) and "tp_faults.py" in str(err.value)
    worker_proc.join(timeout=10)
    assert not worker_proc.is_alive()
    with pytest.raises(RankDiedError, match="shut down"):
        engine.step()


@pytest.mark.parametrize("device, rank, expected", [
    ("cpu", 1, "cpu"),
    ("cuda", 0, "cuda:0"),
    ("cuda", 1, "cuda:1"),
    ("cuda:2", 0, "cuda:2"),
    ("cuda:2", 1, "cuda:3"),
])
def test_rank_device_counts_from_the_configured_card(device, rank, expected):
    assert rank_device(torch.device(device), rank) == torch.device(expected)


def test_too_few_cards_for_the_tp_size_is_a_clear_error(sharded_tied_dir, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match=r"needs cards cuda:1..cuda:2, but this host has 2"):
        LLMEngine(sharded_tied_dir, EngineConfig(num_kv_blocks=8, device="cuda:1", tensor_parallel_size=2))


def test_nccl_group_gets_the_timeout(monkeypatch):
    class FakeNCCL:
        class Options:
            pass

        def __init__(self, store, rank, size, options):
            self.args = (store, rank, size, options)

    monkeypatch.setattr(dist, "ProcessGroupNCCL", FakeNCCL, raising=False)
    group = make_group("store", 1, 2, torch.device("cuda", 1), timeout_s=7)
    store, rank, size, options = group.args
    assert (store, rank, size) == ("store", 1, 2)
    assert options._timeout == datetime.timedelta(seconds=7) and options.is_high_priority_stream is False
    assert parallel.dist is dist


def test_waiting_for_the_device_watches_the_workers():
    calls = []

    def check():
        calls.append(1)
        if len(calls) == 3:
            raise RankDiedError("tensor-parallel rank 1 failed: boom")

    with pytest.raises(RankDiedError, match="boom"):
        wait_watching(lambda: False, check, time.monotonic() + 10, check_every_s=0.001)
    assert wait_watching(lambda: False, lambda: None, time.monotonic() + 0.05) is False
    assert wait_watching(lambda: True, check, time.monotonic()) is True
