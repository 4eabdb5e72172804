"""Vocabulary-parallel token embedding and LM head: each rank owns a contiguous slice of the vocab."""
import torch
import torch.nn.functional as F
from torch import nn

from appliance.engine.linear import PackableLinear, set_weight_loader
from appliance.engine.parallel import ParallelState


class VocabParallelEmbedding(nn.Module):
    weight: torch.Tensor  # a Parameter, typed as PackableLinear's for the LM head that is both

    def __init__(self, vocab_size: int, dim: int, tp: ParallelState):
        super().__init__()
        self.tp = tp
        self.vocab_size = vocab_size
        # Pad so the vocab splits evenly; padded rows are never looked up and their logits are cut.
        self.local = -(-vocab_size // tp.world_size)
        self.start = tp.rank * self.local
        self.weight = nn.Parameter(torch.empty(self.local, dim))
        set_weight_loader(self.weight, self.weight_loader)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        part = loaded[self.start:self.start + self.local]
        param.data[: part.shape[0]].copy_(part)
        param.data[part.shape[0]:].zero_()  # the padding rows (storage comes uninitialised)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.world_size == 1:
            return F.embedding(ids, self.weight)
        mine = (ids >= self.start) & (ids < self.start + self.local)
        out = F.embedding(torch.where(mine, ids - self.start, 0), self.weight)
        out = out * mine.unsqueeze(-1).to(out.dtype)
        return self.tp.all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding, PackableLinear):
    """Hidden states -> logits over the full vocab (shards gathered from all ranks)."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.packed is not None or self.runs_bf16_kernel(hidden):
            logits = self.matmul(hidden)
        else:
            # W @ h^T, not h @ W^T: for the few rows of a decode step MKL streams the big weight
            # faster in this orientation.
            logits = torch.mm(self.weight, hidden.t()).t()
        logits = self.tp.all_gather_last_dim(logits)
        return logits[..., : self.vocab_size]
