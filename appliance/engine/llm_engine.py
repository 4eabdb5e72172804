"""The generation engine: add requests, then step (schedule -> run -> postprocess) until done."""
import dataclasses
import itertools
import logging
from typing import Dict, List, Optional, Sequence as Seq, Tuple, Union

import torch
from transformers import AutoConfig, AutoTokenizer

from appliance.engine.beam_runs import BeamRuns
from appliance.engine.beam_search import BeamSearchParams
from appliance.engine.block_manager import BlockManager
from appliance.engine.config import DType, EngineConfig, EngineKind, engine_config_from
from appliance.engine.detokenizer import IncrementalDetokenizer
from appliance.engine.executor import check_executor, make_executor
from appliance.engine.host import Host
from appliance.engine.kernel_plan import plan_kernels
from appliance.engine.model_fit import engine_host, generate_fit, max_model_len
from appliance.engine.models import get_model_class, model_architecture
from appliance.engine.models.base import MultimodalCausalLM
from appliance.engine.multimodal import image_token_id
from appliance.engine.multimodal import mm_ranges as mm_ranges_of
from appliance.engine.outputs import RequestOutput
from appliance.engine.parallel import rank_device
from appliance.engine.quantized_checkpoint import quantized_format, settle_quantization
from appliance.engine.sampler import SamplerOutput
from appliance.engine.sampling_params import FieldError, SamplingParams
from appliance.engine.scheduler import Scheduler, SchedulerOutput
from appliance.engine.sequence import MMRange, Sequence, SequenceStatus
from appliance.engine.structured_output import GrammarMatchers

log = logging.getLogger(__name__)


def load_tokenizer(model_path: str):
    """The tokenizer of the checkpoint at `model_path`: the engine's, which its pipeline shares."""
    return AutoTokenizer.from_pretrained(model_path)


class LLMEngine:
    def __init__(self, model_path: str, engine_config: Optional[EngineConfig] = None, tokenizer=None,
                 tp_timeout_s: float = 120.0, host: Optional[Host] = None):
        """`tp_timeout_s` bounds TP start-up and each collective, so a hung rank raises instead of hanging.
        `host`: the machine the dtype, KV and kernel rules decide for (default: this one, read at start)."""
        cfg = engine_config_from(engine_config)
        if cfg.kind is not EngineKind.generate:
            raise ValueError("LLMEngine serves engine.kind=generate; use PoolEngine for kind=pool")
        hf_config = AutoConfig.from_pretrained(model_path)
        self.hf_config = hf_config
        self.architecture = model_architecture(None, hf_config, model_path)
        self.image_token_id = image_token_id(hf_config)  # None for a text model
        self.max_model_len = max_model_len(hf_config.get_text_config(), cfg.max_model_len)
        # dtype and KV budget settled (or the model refused) before any weight or tokenizer loads.
        cfg = settle_quantization(cfg, quantized_format(hf_config, model_path), model_path)  # auto: the checkpoint's
        host = engine_host(cfg, host)
        if cfg.cpu_features_off:
            log.info("CPU features treated as absent (engine.cpu_features_off): %s", " ".join(cfg.cpu_features_off))
        plan, geometry = generate_fit(cfg, model_path, hf_config, host, self.max_model_len)
        cfg = dataclasses.replace(cfg, dtype=DType(plan.dtype_name), kv_cache_memory_bytes=plan.kv_cache_memory_bytes)
        log.info("engine.dtype: %s (%s)", plan.dtype_name, plan.dtype_reason)
        self.cfg = cfg
        check_executor(cfg)
        # Which kernel runs each family, decided here once for every rank; its probes run on rank 0's device.
        device = torch.device(cfg.device)
        self.kernels = plan_kernels(cfg, host, geometry,
                                    device if cfg.tensor_parallel_size == 1 else rank_device(device, 0))
        log.info("%s", self.kernels.describe())
        self.tokenizer = tokenizer or load_tokenizer(model_path)
        self.executor = make_executor(model_path, hf_config, cfg, self.max_model_len, self.kernels, tp_timeout_s)
        blocks = self.executor.num_kv_blocks
        log.info("KV cache: %d tokens (%d blocks of %d; %.2f GiB per rank; %s)", blocks * cfg.block_size, blocks,
                 cfg.block_size, plan.kv_cache_memory_bytes / 2 ** 30, plan.kv_reason)
        model_cls = get_model_class(self.architecture)
        # The model's rule for an image item, its config arithmetic done once; None: it takes no images.
        self.check_image_item = model_cls.image_item_check(hf_config) \
            if issubclass(model_cls, MultimodalCausalLM) else None
        self.block_manager = BlockManager(self.executor.num_kv_blocks, cfg.block_size,
                                          cfg.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, cfg.max_num_batched_tokens, cfg.max_num_seqs,
                                   self.max_model_len)
        self.eos_token_ids = self._eos_ids(hf_config.get_text_config(), self.tokenizer)
        self.vocab_size = hf_config.get_text_config().vocab_size
        self.grammars = GrammarMatchers(self.tokenizer, self.vocab_size)
        self.seed_rng = torch.Generator().manual_seed(cfg.seed)  # seeds for requests that give none
        self.device = torch.device(cfg.device)
        self.detokenizers: Dict[str, IncrementalDetokenizer] = {}
        self.arrivals = itertools.count()
        self.beams = BeamRuns(self)  # beam searches, each round's beams run as requests of this engine
        self.step_tokens = 0  # tokens the last step computed, prompt and output (the server's metrics)

    @classmethod
    def from_config(cls, app_cfg, tokenizer=None) -> "LLMEngine":
        """From a composed app config: `model.path` (HF directory) and the `engine` group; `tokenizer`:
        the pipeline's, when a stage loaded it already."""
        path = app_cfg.model.path
        if not path:
            raise ValueError("model.path is not set; point it at a HF model directory")
        return cls(path, engine_config_from(app_cfg.engine), tokenizer=tokenizer)

    @staticmethod
    def _eos_ids(hf_config, tokenizer) -> set:
        ids = getattr(hf_config, "eos_token_id", None)
        ids = set(ids if isinstance(ids, (list, tuple)) else [ids])
        ids.add(getattr(tokenizer, "eos_token_id", None))
        return {i for i in ids if i is not None}

    # ---- requests -------------------------------------------------------------------------------
    def add_request(self, prompt: Union[str, List[int]], sampling_params: Optional[SamplingParams] = None,
                    request_id: Optional[str] = None, mm_ranges: Optional[List[MMRange]] = None,
                    mm_data=None, sibling: Optional[str] = None) -> str:
        """Queue a request; returns its id. `sibling`: the id of a request added just before with the same
        prompt (another answer to it, `n` > 1): this one is admitted once the sibling's prompt is in the
        prefix cache, so the prompt is computed once."""
        params = sampling_params or SamplingParams()
        self._check_token_ids(params)
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if mm_data or self.image_token_id is not None:
            mm_ranges = self._check_mm(ids, list(mm_data or []), mm_ranges)
        arrival = next(self.arrivals)
        request_id = str(arrival) if request_id is None else request_id
        seq = Sequence(request_id, ids, params, arrival, mm_ranges, mm_data)
        seed = params.seed if params.seed is not None else int(
            torch.randint(0, 2 ** 62, (1,), generator=self.seed_rng))
        seq.generator = torch.Generator(device=self.device).manual_seed(seed)
        if params.min_tokens:
            stops = set(params.stop_token_ids) | (set() if params.ignore_eos else self.eos_token_ids)
            seq.min_tokens_suppress = tuple(sorted(stops))
        seq.sibling = self.scheduler.requests.get(sibling) if sibling is not None else None
        if params.structured is not None:
            seq.matcher = self.grammars.matcher(params.structured)  # raises if the grammar cannot compile
        self.scheduler.add(seq)  # raises if the request can never fit
        context = ids if params.decode_after_prompt else []
        self.detokenizers[request_id] = IncrementalDetokenizer(self.tokenizer, context, params.stop)
        return request_id

    def add_beam_search(self, prompt: Union[str, List[int]], params: BeamSearchParams, answer_ids: List[str],
                        mm_data=None) -> None:
        """Queue a beam search (beam_search.py); its `params.width` answers come out, best first, as the
        finished outputs of `answer_ids` once the search ends. ValueError when its longest beams could never
        fit the context or the KV cache."""
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        # Its last round's beams are its longest sequences: each must fit the KV cache on its own.
        self.scheduler.check_fits(Sequence(answer_ids[0], ids, SamplingParams(max_tokens=params.max_tokens), -1))
        if len(ids) + params.max_tokens > self.max_model_len:
            raise FieldError("max_tokens", f"the prompt is {len(ids)} tokens and max_tokens is {params.max_tokens}; "
                                           f"the model's context is {self.max_model_len} tokens")
        self.beams.add(ids, params, answer_ids, mm_data)

    def _check_token_ids(self, params: SamplingParams) -> None:
        for name, ids in (("stop_token_ids", params.stop_token_ids), ("logit_bias", params.logit_bias)):
            outside = [t for t in ids if not 0 <= t < self.vocab_size]
            if outside:
                raise FieldError(name, f"token ids {outside[:5]} are outside the vocabulary "
                                       f"(0 to {self.vocab_size - 1})")

    def _check_mm(self, ids: List[int], mm_data, mm_ranges: Optional[List[MMRange]]) -> Optional[List[MMRange]]:
        """Items in prompt order, each on a run of image tokens, and no image token without an item;
        the items' ranges key the prefix cache. Raises ValueError before anything is scheduled."""
        token = self.image_token_id
        if token is None:
            raise ValueError(f"mm_data was given but {self.architecture} is not a multimodal model")
        n_placeholders = ids.count(token)
        if n_placeholders != sum(item.num_tokens for item in mm_data):
            raise ValueError(f"the prompt holds {n_placeholders} image tokens ({token}) but mm_data covers "
                             f"{sum(item.num_tokens for item in mm_data)}; every image token must belong to "
                             f"an ImageItem (expand each image's token to its num_tokens)")
        if not mm_data:
            return mm_ranges
        if self.check_image_item is None:
            raise ValueError(f"mm_data was given but {self.architecture} takes no images")
        end = 0
        for i, item in enumerate(mm_data):
            self.check_image_item(item)
            run = ids[item.offset:item.offset + item.num_tokens]
            if item.offset < end or item.num_tokens < 1 or len(run) != item.num_tokens \
                    or any(t != token for t in run):
                raise ValueError(f"mm_data[{i}] ({item.content_hash}): offset {item.offset}, num_tokens "
                                 f"{item.num_tokens} must cover a run of image tokens ({token}) in the "
                                 f"prompt, in order and without overlap")
            end = item.offset + item.num_tokens
        derived = mm_ranges_of(mm_data)
        if mm_ranges is not None and [tuple(r) for r in mm_ranges] != derived:
            raise ValueError(f"mm_ranges {mm_ranges} disagree with mm_data's {derived}; pass mm_data alone")
        return derived

    def abort(self, request_id: str) -> None:
        if self.beams.abort(request_id):
            return
        seq = self.scheduler.requests.get(request_id)
        if seq is not None:
            self._finish(seq, "abort")

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def is_running(self, request_id: str) -> bool:
        """The request has been scheduled (and not preempted back to waiting) since it was added."""
        seq = self.scheduler.requests.get(request_id)
        return seq is not None and seq.status == SequenceStatus.RUNNING

    def running_ids(self) -> List[str]:
        """The ids of the requests scheduled now (preempted ones are waiting again)."""
        return [seq.request_id for seq in self.scheduler.running]

    # ---- the step -------------------------------------------------------------------------------
    def step(self) -> List[RequestOutput]:
        scheduled = self.scheduler.schedule()
        if scheduled.is_empty:
            if self.has_unfinished():  # admission checks make this unreachable; fail loudly, never spin
                raise RuntimeError(f"scheduler made no progress with {len(self.scheduler.waiting)} waiting "
                                   f"and {len(self.scheduler.running)} running requests")
            return []
        # The grammar masks of constrained requests are filled while the forward runs.
        masks = self.grammars.start_masks([item.seq.matcher for item in scheduled.scheduled if item.will_sample])
        self.step_tokens = scheduled.num_tokens
        sampled = self.executor.run(scheduled, masks)
        return self._postprocess(scheduled, sampled)

    def _postprocess(self, scheduled: SchedulerOutput, sampled: SamplerOutput) -> List[RequestOutput]:
        for item in scheduled.scheduled:  # before update: a finished prefill's output carries them
            item.seq.prompt_logprobs += sampled.prompt_logprobs.get(item.seq.request_id, ())
        self.scheduler.update(scheduled)
        seqs = [item.seq for item in scheduled.scheduled if item.will_sample]
        outputs = []
        for seq, token, logprobs in zip(seqs, sampled.token_ids, sampled.logprobs):
            seq.append_token(token)
            if seq.matcher is not None:
                seq.matcher.consume_token(token)
            if logprobs is not None:
                seq.output_logprobs.append(logprobs)
            detok = self.detokenizers[seq.request_id]
            delta = detok.add(token, check_stop=seq.num_output_tokens >= seq.sampling_params.min_tokens)
            reason = self._finish_reason(seq, token, detok)
            if reason:
                delta += detok.flush()
            out = self._output(seq, delta, [token], [logprobs] if logprobs is not None else None)
            if reason:
                self._finish(seq, reason)
                out.finished, out.finish_reason = True, reason
            outputs.append(out)
        return self.beams.route(outputs)

    def _finish_reason(self, seq: Sequence, token: int, detok: IncrementalDetokenizer) -> Optional[str]:
        p = seq.sampling_params
        may_stop = seq.num_output_tokens >= p.min_tokens
        if detok.stopped or (may_stop and (token in p.stop_token_ids or
                                           (not p.ignore_eos and token in self.eos_token_ids))):
            return "stop"
        if seq.matcher is not None and seq.matcher.is_stopped():  # the grammar is complete
            return "stop"
        if (p.max_tokens is not None and seq.num_output_tokens >= p.max_tokens) \
                or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def _finish(self, seq: Sequence, reason: str) -> None:
        self.scheduler.finish(seq, reason)
        self.detokenizers.pop(seq.request_id, None)

    def _output(self, seq: Sequence, delta: str, new_ids: List[int], new_lps) -> RequestOutput:
        detok = self.detokenizers[seq.request_id]
        want_lps = seq.sampling_params.logprobs is not None
        want_prompt = seq.sampling_params.prompt_logprobs is not None
        return RequestOutput(request_id=seq.request_id, prompt_token_ids=seq.prompt_token_ids,
                             new_text=delta, new_token_ids=new_ids, new_logprobs=new_lps, text=detok.text,
                             token_ids=seq.output_token_ids,
                             logprobs=list(seq.output_logprobs) if want_lps else None,
                             prompt_logprobs=list(seq.prompt_logprobs) if want_prompt else None)

    # ---- convenience ----------------------------------------------------------------------------
    def generate(self, prompts: Seq[Union[str, List[int]]],
                 sampling_params: Union[SamplingParams, List[SamplingParams], Tuple[SamplingParams, ...], None] = None
                 ) -> List[RequestOutput]:
        """Run the prompts to completion; final outputs in input order."""
        params = list(sampling_params) if isinstance(sampling_params, (list, tuple)) else \
            [sampling_params] * len(prompts)
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, params)]
        final: Dict[str, RequestOutput] = {}
        while any(i not in final for i in ids) and self.has_unfinished():
            for out in self.step():
                if out.finished:
                    final[out.request_id] = out
        return [final[i] for i in ids]

    def stats(self) -> dict:
        bm = self.block_manager
        cache = self.executor.runner.encoder_cache
        return {**(cache.stats() if cache is not None else {}),  # encoder cache: multimodal models
                "num_preemptions": self.scheduler.num_preemptions,
                "num_chunked_prefills": self.scheduler.num_chunked_prefills,
                "prefix_cache_hit_tokens": bm.num_hit_tokens, "prefix_cache_query_tokens": bm.num_query_tokens,
                "kv_blocks_total": bm.num_blocks, "kv_blocks_free": bm.num_free_blocks,
                "num_running": len(self.scheduler.running), "num_waiting": len(self.scheduler.waiting)}

    def close(self) -> None:
        self.grammars.close()
        self.executor.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
