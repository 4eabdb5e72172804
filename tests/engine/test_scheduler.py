"""Table-driven tests of the scheduler with a simulated model (no forward; tokens appended by hand)."""
import pytest

from appliance.engine.block_manager import BlockManager
from appliance.engine.sampling_params import SamplingParams
from appliance.engine.scheduler import Scheduler
from appliance.engine.sequence import Sequence, SequenceStatus

BS = 4


def make(num_blocks=64, budget=64, max_seqs=8, max_len=1024, caching=False):
    return Scheduler(BlockManager(num_blocks, BS, caching), budget, max_seqs, max_len)


def req(rid, n, max_tokens=4, arrival=0):
    return Sequence(rid, list(range(1, n + 1)), SamplingParams(temperature=0, max_tokens=max_tokens), arrival)


def fake_step(sched, next_token=5):
    """Schedule, pretend to run, append a token to sampling sequences, finish those at max_tokens."""
    out = sched.schedule()
    sched.update(out)
    for item in out.scheduled:
        if item.will_sample:
            item.seq.append_token(next_token)
            if item.seq.num_output_tokens >= item.seq.sampling_params.max_tokens:
                sched.finish(item.seq, "length")
    return out


@pytest.mark.parametrize("prompt_lens,budget,max_seqs,expected", [
    # expected: [(request, num_new_tokens)] of the first step
    ([10, 10], 64, 8, [("r0", 10), ("r1", 10)]),
    ([10, 10], 15, 8, [("r0", 10), ("r1", 5)]),  # second prompt chunked by the token budget
    ([40], 16, 8, [("r0", 16)]),  # long prompt chunked
    ([3, 3, 3], 64, 2, [("r0", 3), ("r1", 3)]),  # max_num_seqs
])
def test_first_step(prompt_lens, budget, max_seqs, expected):
    s = make(budget=budget, max_seqs=max_seqs)
    for i, n in enumerate(prompt_lens):
        s.add(req(f"r{i}", n, arrival=i))
    out = s.schedule()
    assert [(it.seq.request_id, it.num_new_tokens) for it in out.scheduled] == expected


def test_decode_and_prefill_share_budget():
    s = make(budget=8)
    s.add(req("a", 4, max_tokens=10))
    fake_step(s)  # a: prefill 4
    s.add(req("b", 20, arrival=1))
    out = fake_step(s)
    assert [(i.seq.request_id, i.num_new_tokens) for i in out.scheduled] == [("a", 1), ("b", 7)]
    assert s.num_chunked_prefills == 1
    assert not out.scheduled[1].will_sample


def test_chunked_prefill_samples_only_at_the_end():
    s = make(budget=6)
    s.add(req("a", 14, max_tokens=2))
    steps = [fake_step(s).scheduled[0] for _ in range(3)]
    assert [(i.num_new_tokens, i.will_sample) for i in steps] == [(6, False), (6, False), (2, True)]


def test_preempts_newest_and_recomputes():
    s = make(num_blocks=4, budget=64)
    a, b = req("a", 7, max_tokens=6), req("b", 7, max_tokens=6, arrival=1)
    s.add(a)
    s.add(b)
    fake_step(s)  # both prefilled (7 tokens): 2 blocks each
    fake_step(s)  # the 8th token still fits
    assert s.block_manager.num_free_blocks == 0
    out = fake_step(s)  # a needs a 3rd block: b (newest) is preempted
    assert out.preempted == [b] and b.status == SequenceStatus.WAITING
    assert b.num_computed_tokens == 0 and b.block_table == [] and b.num_tokens == 9
    assert [i.seq.request_id for i in out.scheduled] == ["a"]
    while s.has_unfinished():
        fake_step(s)
    assert a.num_output_tokens == 6 and b.num_output_tokens == 6
    assert s.num_preemptions >= 1
    s.block_manager.check_no_leaks()


@pytest.mark.parametrize("prompt,max_tokens,blocks,max_len,msg", [
    (30, 10, 8, 1024, "KV blocks"),  # 39 tokens -> 10 blocks > 8
    (600, 1, 1000, 512, "max_model_len"),
])
def test_request_that_can_never_fit_is_rejected(prompt, max_tokens, blocks, max_len, msg):
    s = make(num_blocks=blocks, max_len=max_len)
    with pytest.raises(ValueError, match=msg):
        s.add(req("big", prompt, max_tokens=max_tokens))
    assert not s.has_unfinished()


def test_biggest_request_that_fits_runs_alone_under_pressure():
    # Each request alone needs all 8 blocks at its end: they must take turns, never deadlock.
    s = make(num_blocks=8, budget=16)
    seqs = [req(f"r{i}", 20, max_tokens=13, arrival=i) for i in range(3)]
    for q in seqs:
        s.add(q)
    for _ in range(500):
        if not s.has_unfinished():
            break
        fake_step(s)
    assert not s.has_unfinished()
    assert all(q.num_output_tokens == 13 for q in seqs)
    s.block_manager.check_no_leaks()


def test_duplicate_request_id_rejected():
    s = make()
    s.add(req("x", 3))
    with pytest.raises(ValueError, match="already in use"):
        s.add(req("x", 3))


def test_finish_waiting_and_running():
    s = make(max_seqs=1)
    a, b = req("a", 3), req("b", 3, arrival=1)
    s.add(a)
    s.add(b)
    fake_step(s)
    s.finish(b, "abort")  # still waiting
    s.finish(a, "abort")  # running
    assert not s.has_unfinished()
    s.block_manager.check_no_leaks()
