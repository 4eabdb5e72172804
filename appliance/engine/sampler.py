"""Batched next-token selection: greedy, temperature, top-k, top-p, per-request seeds, top-N logprobs."""
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch

from appliance.engine import cpu_kernels
from appliance.engine.sampling_params import SamplingParams


@dataclass
class SamplerOutput:
    token_ids: List[int]
    logprobs: List[Optional[Dict[int, float]]]  # per row: sampled token first, then the top N


class Sampler:
    def __init__(self, use_cpu_kernels: bool = False):
        self.use_cpu_kernels = use_cpu_kernels  # the greedy argmax on our kernel (its engine's choice)

    def __call__(self, logits: torch.Tensor, params: List[SamplingParams],
                 generators: List[Optional[torch.Generator]],
                 suppress: Optional[List[Sequence[int]]] = None) -> SamplerOutput:
        """logits: [S, V], one row per sequence that samples this step; `suppress[i]`: token ids row i
        must not pick (stop tokens before the request's min_tokens). Logprobs stay those of the raw logits."""
        raw = logits = logits.float()
        if suppress and any(suppress):
            # One indexed write for all rows (per-row writes are a host -> device copy each on a GPU).
            rows = [row for row, ids in enumerate(suppress) for _ in ids]
            cols = [tid for ids in suppress for tid in ids]
            logits = raw.clone()
            logits[torch.tensor(rows, device=logits.device), torch.tensor(cols, device=logits.device)] = float("-inf")
        use_ours = self.use_cpu_kernels and logits.dim() == 2 and cpu_kernels.fits(logits)
        tokens = cpu_kernels.argmax_rows(logits) if use_ours else logits.argmax(dim=-1)
        sample_rows = [i for i, p in enumerate(params) if not p.greedy]
        if sample_rows:
            rows = torch.tensor(sample_rows, device=logits.device)
            tokens[rows] = self._sample(logits[rows], [params[i] for i in sample_rows],
                                        [generators[i] for i in sample_rows])
        token_list = tokens.tolist()
        return SamplerOutput(token_list, self._logprobs(raw, token_list, params))

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
    def _logprobs(logits, tokens, params) -> List[Optional[Dict[int, float]]]:
        want = [p.logprobs for p in params]
        if all(n is None for n in want):
            return [None] * len(params)
        logprobs = torch.log_softmax(logits, dim=-1)  # of the raw logits, as the HF reference reports them
        n_max = max(n or 0 for n in want)
        top_vals, top_ids = logprobs.topk(n_max, dim=-1) if n_max else (None, None)
        chosen = logprobs.gather(1, torch.tensor(tokens, device=logprobs.device)[:, None]).squeeze(1).tolist()
        # One device -> host copy each for the whole batch, not one per row.
        top_ids, top_vals = (top_ids.tolist(), top_vals.tolist()) if n_max else ([], [])
        out = []
        for i, n in enumerate(want):
            if n is None:
                out.append(None)
                continue
            entry = {tokens[i]: chosen[i]}
            for tid, lp in zip(top_ids[i][:n] if n else (), top_vals[i][:n] if n else ()):
                entry.setdefault(tid, lp)
            out.append(entry)
        return out
