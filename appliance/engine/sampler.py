"""Batched next-token selection: greedy, temperature, top-k, top-p, per-request seeds, top-N logprobs;
logit biases, stop tokens held back until min_tokens, and grammar masks (structured output) first."""
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch

from appliance.engine import cpu_kernels
from appliance.engine.sampling_params import SamplingParams
from appliance.engine.structured_output import StepMasks


@dataclass
class SamplerOutput:
    token_ids: List[int]
    logprobs: List[Optional[Dict[int, float]]]  # per row: sampled token first, then the top N
    # {request id: [{prompt token: lp, top N...}, ...]} for the prompt tokens this step scored
    prompt_logprobs: Dict[str, List[Dict[int, float]]] = field(default_factory=dict)


class Sampler:
    def __init__(self, use_cpu_kernels: bool = False):
        self.use_cpu_kernels = use_cpu_kernels  # the greedy argmax on our kernel (its engine's kernel plan)

    def __call__(self, logits: torch.Tensor, params: List[SamplingParams],
                 generators: List[Optional[torch.Generator]],
                 suppress: Optional[List[Sequence[int]]] = None, masks: Optional[StepMasks] = None
                 ) -> SamplerOutput:
        """logits: [S, V], one row per sequence that samples this step; `suppress[i]`: token ids row i
        must not pick (stop tokens before the request's min_tokens); `masks`: the tokens each constrained
        row may pick. Logprobs stay those of the raw logits."""
        raw = logits.float()
        logits = self._adjusted(raw, params, suppress, masks)
        use_ours = self.use_cpu_kernels and logits.dim() == 2 and cpu_kernels.fits(logits)
        tokens = cpu_kernels.argmax_rows(logits) if use_ours else logits.argmax(dim=-1)
        sample_rows = [i for i, p in enumerate(params) if not p.greedy]
        if sample_rows:
            rows = torch.tensor(sample_rows, device=logits.device)
            tokens[rows] = self._sample(logits[rows], [params[i] for i in sample_rows],
                                        [generators[i] for i in sample_rows])
        token_list = tokens.tolist()
        return SamplerOutput(token_list, self._logprobs(raw, token_list, params))

    @staticmethod
    def _adjusted(raw: torch.Tensor, params: List[SamplingParams], suppress, masks: Optional[StepMasks]):
        """`raw` with each row's logit biases added and its forbidden tokens at -inf (a copy, when any)."""
        biased = [(row, p.logit_bias) for row, p in enumerate(params) if p.logit_bias]
        held = suppress is not None and any(suppress)
        if not (biased or held or masks is not None):
            return raw
        logits = raw.clone()
        device = logits.device
        if biased:  # one indexed add for all rows (a per-row write is a host -> device copy each on a GPU)
            rows = [row for row, bias in biased for _ in bias]
            cols = [tid for _, bias in biased for tid in bias]
            values = [value for _, bias in biased for value in bias.values()]
            logits[torch.tensor(rows, device=device), torch.tensor(cols, device=device)] += \
                torch.tensor(values, device=device, dtype=logits.dtype)
        if held:
            rows = [row for row, ids in enumerate(suppress) for _ in ids]
            cols = [tid for ids in suppress for tid in ids]
            logits[torch.tensor(rows, device=device), torch.tensor(cols, device=device)] = float("-inf")
        if masks is not None:
            mask_rows = torch.tensor(masks.rows, device=device)
            vocab = min(logits.shape[1], masks.allowed.shape[1])
            constrained = logits[mask_rows]
            constrained[:, :vocab].masked_fill_(~masks.allowed[:, :vocab].to(device), float("-inf"))
            constrained[:, vocab:] = float("-inf")  # padding rows of the embedding are never a token
            logits[mask_rows] = constrained
        return logits

    def _sample(self, logits, params, generators) -> torch.Tensor:
        temp = torch.tensor([p.temperature for p in params], device=logits.device)
        logits = logits / temp[:, None]
        vocab = logits.shape[-1]
        top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params],
                             device=logits.device)
        top_p = torch.tensor([p.top_p for p in params], device=logits.device)
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        rank = torch.arange(vocab, device=logits.device)[None, :]
        drop = rank >= top_k[:, None]
        probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always survives).
        drop |= (probs.cumsum(dim=-1) - probs) >= top_p[:, None]
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        probs = sorted_logits.softmax(dim=-1)
        # Exponential-race sampling: argmax(p / E) with E ~ Exp(1) draws from p, and lets each row use
        # its own generator so a seeded request is reproducible whatever it is batched with.
        noise = torch.empty_like(probs)
        for i, g in enumerate(generators):
            noise[i].exponential_(generator=g)
        choice = (probs / noise).argmax(dim=-1)
        return order.gather(1, choice[:, None]).squeeze(1)

    @staticmethod
    def score(logits: torch.Tensor, targets: List[int], top_n: int) -> List[Dict[int, float]]:
        """Per row: {target: its logprob, then the top N}, from the raw logits (prompt_logprobs)."""
        return scored_entries(torch.log_softmax(logits.float(), dim=-1), targets, [top_n] * len(targets))

    @staticmethod
    def _logprobs(logits, tokens, params) -> List[Optional[Dict[int, float]]]:
        want = [p.logprobs for p in params]
        if all(n is None for n in want):
            return [None] * len(params)
        # of the raw logits, as the HF reference reports them
        return logprob_entries(torch.log_softmax(logits, dim=-1), tokens, want)


def logprob_entries(logprobs: torch.Tensor, tokens: List[int], top_ns: List[Optional[int]]
                    ) -> List[Optional[Dict[int, float]]]:
    """The logprobs entry of each row of `logprobs` [R, V]: {its token: logprob, then the row's top N in
    order, the token not repeated}; None for a row whose N is None (it asked for none)."""
    entries = scored_entries(logprobs, tokens, [n or 0 for n in top_ns])
    return [None if n is None else entry for n, entry in zip(top_ns, entries)]


def scored_entries(logprobs: torch.Tensor, tokens: List[int], top_ns: List[int]) -> List[Dict[int, float]]:
    """`logprob_entries` for rows that each ask for N entries."""
    n_max = max(top_ns, default=0)
    chosen = logprobs.gather(1, torch.tensor(tokens, device=logprobs.device)[:, None]).squeeze(1).tolist()
    # One device -> host copy each for the whole batch, not one per row.
    if n_max:
        top_vals, top_ids = (t.tolist() for t in logprobs.topk(n_max, dim=-1))
    else:
        top_vals = top_ids = [[] for _ in tokens]
    out: List[Dict[int, float]] = []
    for token, lp, n, ids, vals in zip(tokens, chosen, top_ns, top_ids, top_vals):
        entry = {token: lp}
        for tid, value in zip(ids[:n], vals[:n]):
            entry.setdefault(tid, value)
        out.append(entry)
    return out
