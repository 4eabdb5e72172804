"""Owns the model and its KV pool; turns a scheduled batch into one forward and sampled tokens.

It makes no scheduling decisions: `prepare` flattens what the scheduler chose, `execute` runs the
forward (every tensor-parallel rank calls it), `run` adds sampling on rank 0.

The model is the registered class of the checkpoint's architecture, a `CausalLM` (models/base.py).
Multimodal models (`MultimodalCausalLM`): `prepare` (rank 0 only) finds, for each
scheduled chunk [start, end), the `ImageItem`s of `seq.mm_data` whose placeholder run overlaps it, gets
each item's embeddings once per request (held for the request's later chunks; across requests through
the `EncoderCache`, keyed by content hash, within `engine.encoder_cache_bytes`; the step's misses in one
`model.embed_images` call) and puts the overlapping slice into the step (`mm_rows`, `mm_embeds`).
`execute` embeds the tokens and overwrites those rows.
"""
import contextlib
import logging
import weakref
from typing import Dict, List, Optional

import torch

from appliance.engine import cpu_kernels, hugepages
from appliance.engine.attention_geometry import AttentionGeometry
from appliance.engine.attention_select import make_backend
from appliance.engine.config import EngineConfig, resolve_dtype
from appliance.engine.context import StepContext, StepInput
from appliance.engine.encoder_cache import EncoderCache
from appliance.engine.kernel_plan import KernelPlan
from appliance.engine.linear import add_int4_groups, pack_for_cpu, quantize_projections, use_bf16_kernel
from appliance.engine.loader import iter_weights
from appliance.engine.materialize import build_on_meta, materialize
from appliance.engine.models import get_model_class, model_architecture
from appliance.engine.models.base import CausalLM, MultimodalCausalLM
from appliance.engine.parallel import ParallelState
from appliance.engine.quantized_checkpoint import linear_tensors, quantized_format
from appliance.engine.sampler import Sampler, SamplerOutput
from appliance.engine.scheduler import SchedulerOutput

log = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, model_path: str, hf_config, cfg: EngineConfig, max_model_len: int, plan: KernelPlan,
                 tp: Optional[ParallelState] = None, device: Optional[torch.device] = None):
        """`plan`: the engine's kernel plan (kernel_plan.py), the same on every rank; this runner applies it
        to its model and sampler, and decides none of it."""
        self.cfg = cfg
        self.plan = plan
        self.tp = tp or ParallelState()
        self.device = device or torch.device(cfg.device)
        self.dtype = resolve_dtype(cfg.dtype)
        self.block_size = cfg.block_size
        model_cls = get_model_class(model_architecture(None, hf_config, model_path))
        self.attn_backend = make_backend(plan.attention)
        # Built without memory, given storage in the final dtype, filled once from the checkpoint.
        model = build_on_meta(lambda: model_cls(hf_config, self.tp, self.attn_backend, max_model_len))
        weights = iter_weights(model_path)
        quantized_checkpoint = quantized_format(hf_config, model_path)
        if plan.int4 is not None and quantized_checkpoint is not None:
            # A checkpoint quantised already (its group size the plan's: settle_quantization): its int4
            # groups load beside q, to be packed as they are.
            add_int4_groups(model, plan.int4.group_size, plan.int4.group_sizes)
            weights = linear_tensors(weights, quantized_checkpoint, plan.int4.dtype, hf_config.get_text_config(),
                                     model_path)
        self.model: CausalLM = materialize(model, self.device, self.dtype).eval()
        self.model.load_weights(weights)
        quantized = plan.int8 or plan.int4
        if quantized is not None:
            saved = quantize_projections(self.model, quantized)
            log.info("engine.quantization=%s: the decoder's weights take %.2f GB less", cfg.quantization.value,
                     saved / 1e9)
        if plan.packed_gemm:
            pack_for_cpu(self.model, plan.bf16_units)
        if plan.bf16_weight_rows:
            use_bf16_kernel(self.model, plan.bf16_weight_rows)
        if plan.fused_ops:
            cpu_kernels.use_in(self.model)  # RMSNorm, rotary, SwiGLU, the KV write
        self.num_kv_blocks = self._allocate_kv_cache()
        self.sampler = Sampler(plan.argmax)
        self.multimodal = isinstance(self.model, MultimodalCausalLM)
        self.encoder_cache = EncoderCache(cfg.encoder_cache_bytes) if self.multimodal else None
        # Per in-flight request: embeddings its later prefill chunks still need (gone with the Sequence).
        self._held: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    def _allocate_kv_cache(self) -> int:
        layers = self.model.attention_layers()
        a = layers[0]
        geometry = AttentionGeometry(a.num_heads, a.num_kv_heads, a.head_dim, self.block_size, len(layers))
        bytes_per_block = geometry.block_bytes(self.dtype)
        n = self.cfg.num_kv_blocks
        if not n:
            if self.cfg.kv_cache_memory_bytes is None:
                raise ValueError("the KV cache has no size: set engine.kv_cache_memory_bytes or engine.num_kv_blocks")
            n = self.cfg.kv_cache_memory_bytes // bytes_per_block
        if n < 1:
            raise ValueError(f"engine.kv_cache_memory_bytes={self.cfg.kv_cache_memory_bytes} holds no KV "
                             f"block ({bytes_per_block} bytes each); raise it or set engine.num_kv_blocks")
        # One pool for every layer's K and V (on CPU in huge pages: decode attention streams it).
        shape = (len(layers), 2, n, self.block_size, a.num_kv_heads, a.head_dim)
        if self.device.type == "cpu":
            pool = hugepages.zeros(shape, self.dtype)  # zeros: padded gathers read unused slots
        else:
            pool = torch.zeros(shape, dtype=self.dtype, device=self.device)
        for i, layer in enumerate(layers):
            layer.k_cache, layer.v_cache = pool[i, 0], pool[i, 1]
        return n

    def prepare(self, out: SchedulerOutput) -> StepInput:
        step = StepInput([], [], [], [], [], [], [])
        bs = self.block_size
        row = 0
        mm_pieces: List[torch.Tensor] = []
        if self.multimodal:
            self._encode_new_images(out)
        for item in out.scheduled:
            seq, start = item.seq, item.seq.num_computed_tokens
            end = start + item.num_new_tokens
            if seq.mm_data and self.multimodal:
                self._image_rows(seq, start, end, row, step.mm_rows, mm_pieces)
            step.input_ids += seq.token_ids[start:end]
            step.positions += range(start, end)
            table = seq.block_table
            step.slot_mapping += [table[p // bs] * bs + p % bs for p in range(start, end)]
            step.query_lens.append(item.num_new_tokens)
            step.context_lens.append(end)
            step.block_tables.append(table[: -(-end // bs)])
            first, count = seq.prompt_scoring(start, end)
            step.prompt_rows += range(row + first - start, row + first - start + count)
            row += item.num_new_tokens
            if item.will_sample:
                step.sample_rows.append(row - 1)
        if mm_pieces:
            step.mm_embeds = torch.cat(mm_pieces)
        return step

    def _overlapping(self, seq, start: int, end: int):
        for image in seq.mm_data:
            lo, hi = max(start, image.offset), min(end, image.offset + image.num_tokens)
            if lo < hi:
                yield image, lo, hi

    def _encode_new_images(self, out: SchedulerOutput) -> None:
        """Embeddings of the step's images not yet held for their request (one lookup per request and
        image, even if the image repeats in the prompt): from the encoder cache, the misses encoded
        together (one tower call for the step)."""
        need = []
        for item in out.scheduled:
            seq, start = item.seq, item.seq.num_computed_tokens
            if seq.mm_data:
                held = self._held.setdefault(seq, {})
                overlapping = self._overlapping(seq, start, start + item.num_new_tokens)
                new = {image.content_hash: image for image, _, _ in overlapping if image.content_hash not in held}
                need += [(held, image) for image in new.values()]
        if not need:
            return
        model, cache = self.model, self.encoder_cache
        if not isinstance(model, MultimodalCausalLM) or cache is None:
            raise RuntimeError(f"{type(model).__name__} takes no images, yet a request holds some")
        with torch.inference_mode():
            embs = cache.get_or_compute_many(
                [image.content_hash for _, image in need],
                lambda idx: model.embed_images([need[i][1] for i in idx]))
        for (held, image), emb in zip(need, embs):
            held[image.content_hash] = emb

    def _image_rows(self, seq, start: int, end: int, row: int, rows: list, pieces: list) -> None:
        """Rows (of the flattened batch) and embeddings of the image placeholders in [start, end)."""
        held: Dict[str, torch.Tensor] = self._held[seq]
        for image, lo, hi in self._overlapping(seq, start, end):
            emb = held[image.content_hash]
            rows.extend(range(row + lo - start, row + hi - start))
            pieces.append(emb[lo - image.offset:hi - image.offset])
        # Stop holding what no later chunk needs (an image may appear twice in one prompt).
        later = {im.content_hash for im in seq.mm_data if im.offset + im.num_tokens > end}
        for h in [h for h in held if h not in later]:
            del held[h]

    def on_device(self):
        """CUDA work (Triton launches, generators) goes to this runner's card, not the current one,
        without changing the process's current device."""
        return torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()

    @torch.inference_mode()
    def execute(self, step: StepInput) -> torch.Tensor:
        """One forward over the flattened batch; logits [S, V] of the rows that sample."""
        with self.on_device():
            return self._execute(step)

    def _execute(self, step: StepInput) -> torch.Tensor:
        # Everything the layers share is built here, once per step: the only host -> device copies.
        ctx = StepContext.build(step, self.block_size, self.device, self.attn_backend.decode_group_size)
        ctx.attn_meta = self.attn_backend.prepare(step, ctx)
        ids = torch.tensor(step.input_ids, dtype=torch.long, device=self.device)
        if step.mm_rows:
            if step.mm_embeds is None:
                raise ValueError("a step with image rows carries no image embeddings")
            rows = torch.tensor(step.mm_rows, dtype=torch.long, device=self.device)
            ids[rows] = 0  # placeholder ids may lie outside the vocab; their embeddings are replaced
            embeds = self.model.embed_tokens(ids)
            embeds[rows] = step.mm_embeds.to(embeds.device, embeds.dtype)
            hidden = self.model(None, ctx.positions, ctx, inputs_embeds=embeds)
        else:
            hidden = self.model(ids, ctx.positions, ctx)
        return self.model.compute_logits(hidden[ctx.sample_rows])

    def run(self, step: StepInput, out: SchedulerOutput, masks=None) -> SamplerOutput:
        return self.sample(self.execute(step), out, masks)

    def sample(self, logits: torch.Tensor, out: SchedulerOutput, masks=None) -> SamplerOutput:
        """`masks`: a future of the step's grammar masks (structured_output.GrammarMatchers), filled
        while the forward ran, or None."""
        sampled = [item.seq for item in out.scheduled if item.will_sample]
        with self.on_device():
            result = self.sampler(logits[:len(sampled)], [s.sampling_params for s in sampled],
                                  [s.generator for s in sampled], [s.suppressed_ids() for s in sampled],
                                  masks.result() if masks is not None else None)
            if logits.shape[0] > len(sampled):
                result.prompt_logprobs = self._prompt_logprobs(logits[len(sampled):], out)
        return result

    def _prompt_logprobs(self, logits: torch.Tensor, out: SchedulerOutput) -> Dict[str, List[Dict[int, float]]]:
        """{request id: this step's prompt entries} from the prompt rows' logits, in `prepare`'s order."""
        scored, row = {}, 0
        for item in out.scheduled:
            seq, start = item.seq, item.seq.num_computed_tokens
            first, count = seq.prompt_scoring(start, start + item.num_new_tokens)
            top_n = seq.sampling_params.prompt_logprobs
            if count and top_n is not None:  # count is 0 unless the request asks for prompt_logprobs
                targets = seq.token_ids[first + 1:first + 1 + count]
                scored[seq.request_id] = self.sampler.score(logits[row:row + count], targets, top_n)
                row += count
        return scored
