"""Owns the model and its KV pool; turns a scheduled batch into one forward and sampled tokens.

It makes no scheduling decisions: `prepare` flattens what the scheduler chose, `execute` runs the
forward (every tensor-parallel rank calls it), `run` adds sampling on rank 0.
"""
from typing import Optional

import torch

from appliance.config.schema import EngineConfig
from appliance.engine.attention import select_backend
from appliance.engine.context import StepContext, StepInput
from appliance.engine.loader import load_weights
from appliance.engine.models import get_model_class
from appliance.engine.parallel import ParallelState
from appliance.engine.sampler import Sampler, SamplerOutput
from appliance.engine.scheduler import SchedulerOutput

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"engine.dtype {name!r} is not one of {', '.join(DTYPES)}")
    return DTYPES[name]


class ModelRunner:
    def __init__(self, model_path: str, hf_config, cfg: EngineConfig, max_model_len: int,
                 tp: Optional[ParallelState] = None, device: Optional[torch.device] = None):
        self.cfg = cfg
        self.tp = tp or ParallelState()
        self.device = device or torch.device(cfg.device)
        self.dtype = resolve_dtype(cfg.dtype)
        self.block_size = cfg.block_size
        arch = (getattr(hf_config, "architectures", None) or ["LlamaForCausalLM"])[0]
        backend = select_backend(cfg.attention_backend, self.device)
        with torch.device(self.device):
            model = get_model_class(arch)(hf_config, self.tp, backend, max_model_len)
        self.model = model.to(self.dtype).eval()
        load_weights(self.model, model_path)
        self.num_kv_blocks = self._allocate_kv_cache()
        self.sampler = Sampler()

    def _allocate_kv_cache(self) -> int:
        layers = self.model.attention_layers()
        a = layers[0]
        elem = torch.empty((), dtype=self.dtype).element_size()
        bytes_per_block = 2 * len(layers) * self.block_size * a.num_kv_heads * a.head_dim * elem
        n = self.cfg.num_kv_blocks or self.cfg.kv_cache_memory_bytes // bytes_per_block
        if n < 1:
            raise ValueError(f"engine.kv_cache_memory_bytes={self.cfg.kv_cache_memory_bytes} holds no KV "
                             f"block ({bytes_per_block} bytes each); raise it or set engine.num_kv_blocks")
        for layer in layers:
            shape = (n, self.block_size, a.num_kv_heads, a.head_dim)
            layer.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
            layer.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        return n

    def prepare(self, out: SchedulerOutput) -> StepInput:
        step = StepInput([], [], [], [], [], [], [])
        bs = self.block_size
        row = 0
        for item in out.scheduled:
            seq, start = item.seq, item.seq.num_computed_tokens
            end = start + item.num_new_tokens
            step.input_ids += seq.token_ids[start:end]
            step.positions += range(start, end)
            table = seq.block_table
            step.slot_mapping += [table[p // bs] * bs + p % bs for p in range(start, end)]
            step.query_lens.append(item.num_new_tokens)
            step.context_lens.append(end)
            step.block_tables.append(table[: -(-end // bs)])
            row += item.num_new_tokens
            if item.samples:
                step.sample_rows.append(row - 1)
        return step

    @torch.inference_mode()
    def execute(self, step: StepInput) -> torch.Tensor:
        """One forward over the flattened batch; logits [S, V] of the rows that sample."""
        ctx = StepContext.build(step, self.block_size, self.device)
        ids = torch.tensor(step.input_ids, dtype=torch.long, device=self.device)
        hidden = self.model(ids, ctx.positions, ctx)
        return self.model.compute_logits(hidden[ctx.sample_rows])

    def run(self, step: StepInput, out: SchedulerOutput) -> SamplerOutput:
        logits = self.execute(step)
        sampled = [item.seq for item in out.scheduled if item.samples]
        return self.sampler(logits, [s.sampling_params for s in sampled], [s.generator for s in sampled])
