"""Per-step batch metadata: built once by the model runner, read by every attention layer."""
from dataclasses import dataclass, field
from typing import Any, List, Optional

import torch


@dataclass
class StepInput:
    """One step's flattened batch as plain Python data (cheap to pickle and broadcast to TP ranks).

    Tokens of all scheduled sequences are concatenated; sequence i owns rows
    [query_start[i], query_start[i] + query_lens[i]).
    """

    input_ids: List[int]
    positions: List[int]
    slot_mapping: List[int]  # cache slot (block_id * block_size + offset) each new token's K/V goes to
    query_lens: List[int]  # new tokens per sequence
    context_lens: List[int]  # tokens each sequence attends to after this step (cached + new)
    block_tables: List[List[int]]
    sample_rows: List[int]  # rows whose logits pick a next token (the last row of finished prefills)
    # Rows whose logits score the prompt's next token (requests asking for prompt_logprobs), after
    # sample_rows in the logits the runner returns.
    prompt_rows: List[int] = field(default_factory=list)
    # Multimodal: rows whose input embedding is an image embedding rather than the token's, and those
    # embeddings [len(mm_rows), hidden] (rank 0 computes them). Empty / None on text-only steps.
    mm_rows: List[int] = field(default_factory=list)
    mm_embeds: Optional[torch.Tensor] = None


@dataclass
class DecodeGroup:
    rows: torch.Tensor  # [n] token rows
    block_tables: torch.Tensor  # [n, width], padded with block 0
    context_lens: torch.Tensor  # [n]
    all_rows: bool = False  # rows == 0..T-1: the step is this group alone, in order


DECODE_GROUP_SIZE = 8


def step_kind(query_lens: List[int], context_lens: List[int]) -> str:
    """`decode`: every sequence computes one token; `prefill`: every sequence is a whole prompt with
    nothing cached; `mixed`: anything else (later chunks, prefix-cache hits, decodes beside prefills)."""
    if all(n == 1 for n in query_lens):
        return "decode"
    if query_lens == context_lens:
        return "prefill"
    return "mixed"


@dataclass
class StepContext:
    """Tensor form of a StepInput on the model's device, plus the splits the attention backend needs."""

    positions: torch.Tensor  # [T]
    slot_mapping: torch.Tensor  # [T]
    query_lens: List[int]
    context_lens: List[int]
    query_start: List[int]  # len B + 1
    block_tables: List[List[int]]
    sample_rows: torch.Tensor  # [S + P]: the rows that sample, then those scoring prompt tokens
    block_size: int
    # Sequences computing exactly one token (decodes) are batched by the torch backend, in groups of
    # similar context length so that padding every table to the group's longest wastes little.
    decode_seqs: List[int]
    decode_groups: List["DecodeGroup"]
    kind: str = "mixed"  # step_kind(): decode | prefill | mixed
    attn_meta: Any = None  # what the attention backend's `prepare` built for this step, shared by all layers

    @classmethod
    def build(cls, step: StepInput, block_size: int, device: torch.device,
              decode_group_size: Optional[int] = DECODE_GROUP_SIZE) -> "StepContext":
        """decode_group_size None: all decodes in one group, in batch order (for a backend that reads
        each table as it is, with no padded copy); 0: no decode groups (the backend builds its own)."""
        def t(x):
            return torch.tensor(x, dtype=torch.long, device=device)

        query_start = [0]
        for n in step.query_lens:
            query_start.append(query_start[-1] + n)
        decode_seqs = [i for i, n in enumerate(step.query_lens) if n == 1]
        ctx = cls(positions=t(step.positions), slot_mapping=t(step.slot_mapping),
                  query_lens=step.query_lens, context_lens=step.context_lens, query_start=query_start,
                  block_tables=step.block_tables, sample_rows=t(step.sample_rows + step.prompt_rows),
                  block_size=block_size, decode_seqs=decode_seqs, decode_groups=[],
                  kind=step_kind(step.query_lens, step.context_lens))
        if decode_group_size == 0:
            return ctx
        if decode_group_size is None:
            order, decode_group_size = decode_seqs, max(len(decode_seqs), 1)
        else:
            order = sorted(decode_seqs, key=lambda i: step.context_lens[i])
        for g in range(0, len(order), decode_group_size):
            seqs = order[g:g + decode_group_size]
            width = max(len(step.block_tables[i]) for i in seqs)
            ctx.decode_groups.append(DecodeGroup(
                rows=t([query_start[i] for i in seqs]),
                block_tables=t([step.block_tables[i] + [0] * (width - len(step.block_tables[i])) for i in seqs]),
                context_lens=t([step.context_lens[i] for i in seqs]),
                all_rows=[query_start[i] for i in seqs] == list(range(query_start[-1]))))
        return ctx
