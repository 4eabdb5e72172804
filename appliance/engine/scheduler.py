"""Decides, each step, which sequences run and how many of their tokens are computed.

FCFS. One token budget per step is shared by decodes and (possibly chunked) prefills. Running
sequences go first; when the KV cache is full the newest running sequence is preempted (its blocks
freed, recomputed later from the front of the waiting queue). A request that could never fit on its
own is rejected when it is added, so the loop always makes progress.
"""
from collections import deque
from dataclasses import dataclass, field
from typing import Dict, List

from appliance.engine.block_manager import BlockManager, cdiv
from appliance.engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int  # tokens whose K/V this step computes, starting at seq.num_computed_tokens
    will_sample: bool  # the step reaches the sequence's last token, so its logits pick the next one


@dataclass
class SchedulerOutput:
    scheduled: List[ScheduledSeq] = field(default_factory=list)
    preempted: List[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_batched_tokens: int, max_num_seqs: int,
                 max_model_len: int):
        self.block_manager = block_manager
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.waiting: deque = deque()
        self.running: List[Sequence] = []
        self.requests: Dict[str, Sequence] = {}
        self.num_preemptions = 0
        self.num_chunked_prefills = 0  # steps that computed only part of a prompt

    def max_len(self, seq: Sequence) -> int:
        """Tokens the sequence may reach: prompt + max_tokens, or the whole context when max_tokens is None."""
        max_tokens = seq.sampling_params.max_tokens
        if max_tokens is None:
            return self.max_model_len
        return min(seq.num_prompt_tokens + max_tokens, self.max_model_len)

    def add(self, seq: Sequence) -> None:
        if seq.request_id in self.requests:
            raise ValueError(f"request id {seq.request_id!r} is already in use")
        self.check_fits(seq)
        self.requests[seq.request_id] = seq
        self.waiting.append(seq)

    def check_fits(self, seq: Sequence) -> None:
        """ValueError when the sequence could never run: a prompt that leaves no room in the context, or
        more KV blocks at its longest than the cache has."""
        if answer_room(seq.num_prompt_tokens, self.max_model_len) < 1:
            raise ValueError(
                f"request {seq.request_id!r}: prompt has {seq.num_prompt_tokens} tokens but "
                f"max_model_len is {self.max_model_len}; shorten the prompt or raise engine.max_model_len")
        bm = self.block_manager
        # The K/V of the final token is never written, hence the -1.
        need = cdiv(self.max_len(seq) - 1, bm.block_size)
        if need > bm.num_blocks:
            raise ValueError(
                f"request {seq.request_id!r} needs up to {need} KV blocks (prompt {seq.num_prompt_tokens} "
                f"+ max_tokens {seq.sampling_params.max_tokens or 'up to the context'}) but the cache has only "
                f"{bm.num_blocks}; "
                f"lower max_tokens or raise engine.kv_cache_memory_bytes / engine.num_kv_blocks")

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        bm = self.block_manager
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not bm.allocate(seq, seq.num_computed_tokens + n):
                victim = self.running.pop()  # newest; all older ones are already scheduled
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            if seq.status != SequenceStatus.RUNNING:
                break
            self._schedule(out, seq, n)
            budget -= n
            i += 1

        # Admit waiting requests in order; stop at the first that does not fit (FCFS).
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not out.preempted:
            seq = self.waiting[0]
            if self._sibling_computing(seq):
                break  # admitted once the sibling's prompt is in the prefix cache: computed once, not n times
            # A request scoring its prompt computes every prompt position: it takes no cached blocks.
            cached = [] if seq.sampling_params.prompt_logprobs is not None else bm.find_cached_prefix(seq)
            n = min(seq.num_tokens - len(cached) * bm.block_size, budget)
            if not bm.allocate(seq, len(cached) * bm.block_size + n, cached):
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self._schedule(out, seq, n)
            budget -= n
        return out

    def _sibling_computing(self, seq: Sequence) -> bool:
        """`seq` shares its prompt with `seq.sibling` (a request's other answers, `n` > 1), whose prompt is
        still being computed."""
        sibling = seq.sibling
        return (sibling is not None and self.block_manager.enable_prefix_caching
                and sibling.status == SequenceStatus.RUNNING
                and sibling.num_computed_tokens < sibling.num_prompt_tokens)

    def _schedule(self, out: SchedulerOutput, seq: Sequence, n: int) -> None:
        item = ScheduledSeq(seq, n, seq.num_computed_tokens + n == seq.num_tokens)
        if not item.will_sample:
            self.num_chunked_prefills += 1
        out.scheduled.append(item)

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free_seq(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def update(self, out: SchedulerOutput) -> None:
        """After the forward: advance progress and publish newly full blocks to the prefix cache."""
        for item in out.scheduled:
            item.seq.num_computed_tokens += item.num_new_tokens
            self.block_manager.cache_full_blocks(item.seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        """End a request (done, stopped or aborted) and release its blocks."""
        if seq.status == SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status == SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self.block_manager.free_seq(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self.requests.pop(seq.request_id, None)


def answer_room(prompt_tokens: int, max_model_len: int) -> int:
    """Tokens an answer may take after the prompt. The rule for "the prompt fits": room for at least one
    (the last prompt position produces the first token's logits); stages/engine_stage.py words it for users."""
    return max_model_len - prompt_tokens
