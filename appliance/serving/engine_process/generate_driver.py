"""Generation requests on the engine loop: chat and completion requests in, token events out.

A request's life: `admit` queues it for a preparer, a preparer thread that prepares every waiting request as
one group (chat: through the online head together, i.e. `chat_prompt`: templates, images, placeholders;
completion: tokenize) and hands them over together, `on_prepared` adds it to the `LLMEngine` on the
loop's thread, every `step` hands the engine's outputs to `AnswerEvents` (answer_events.py: each step's
delta when the client streams, the whole answer at the end otherwise) and their timings to
`RequestMetrics` (request_metrics.py), `abort` frees its KV blocks at once.

A request asking `n` answers to each of its prompts is n engine requests per prompt (`engine_id`), the
prompt's first answer and its siblings (`LLMEngine.add_request(sibling=...)`): the prompt is computed
once and its KV blocks shared through the prefix cache. With `use_beam_search` the n answers to a prompt
are one beam search's (`LLMEngine.add_beam_search`), each answer's whole text in one output when the
search ends. Events carry the answer's choice index; the request ends when every answer has.

`/tokenize`, `/detokenize` and `/tokenizer_info` jobs go to `Tokenizing` (tokenizing.py) and never enter the engine.
"""
import logging
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

from appliance.engine.sampling_params import SamplingParams, over_defaults
from appliance.errors import InputError
from appliance.pipeline import Pipeline
from appliance.protocol.openai_responses import echo_text, token_decoder
from appliance.serving.engine_process.answer_events import AnswerEvents
from appliance.serving.engine_process.inbox import Prepared, Tokenized, Unanswerable
from appliance.serving.engine_process.records import ChatRecord, as_record
from appliance.serving.engine_process.request_metrics import RequestMetrics, kv_usage, waiting
from appliance.serving.engine_process.sessions import ChoiceState, Session, engine_id, request_of
from appliance.serving.engine_process.stats_log import StatsLog, generate_line
from appliance.serving.engine_process.tokenizing import Tokenizing
from appliance.serving.engine_process.driver import Driver
from appliance.serving.messages import (Admitted, DetokenizeJob, Done, Failed, GenerateJob, TokenizeJob,
                                       TokenizerInfoJob)
from appliance.stages.engine_stage import EngineStage

log = logging.getLogger(__name__)
# Answers one request may ask for (prompts x n): each is a sequence in the engine, and the queue limit
# (server.limits.max_queued_requests) counts requests, so one body must not hold thousands.
MAX_ANSWERS = 1024


class GenerateDriver(Driver):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Requests waiting for a preparer, and how many preparers run (at most self.preparer_threads).
        self.unprepared: List[Tuple[str, GenerateJob]] = []
        self.unprepared_lock = threading.Lock()
        self.active_preparers = 0
        self.tokenizing = Tokenizing(self)  # /tokenize, /detokenize, /tokenizer_info: beside the engine

    def message_handlers(self) -> Dict[type, Callable[[Any], None]]:
        return {**super().message_handlers(), Prepared: self.on_prepared, Tokenized: self.on_tokenized}

    def start(self) -> None:
        # The pipeline's `engine` stage, the engine's one handle: requests are added, stepped and aborted
        # through it as `appliance run` does; the model's facts (tokenizer, KV stats) are read from its engine.
        stage = self.online.engine
        if not isinstance(stage, EngineStage):
            raise RuntimeError("the served pipeline has no engine stage to generate with")
        self.stage = stage
        self.engine = stage.generating_engine()
        self.head = Pipeline(self.online.head, ready=True)
        self.sessions: Dict[str, Session] = {}
        # Requests in the engine that no step has run yet: their queue time is still to observe.
        self.unstarted: Dict[str, Session] = {}
        # Requests in the engine with several answers: while there are any, running sequences are not
        # running requests (publish).
        self.several: Set[str] = set()
        # The pipeline's one tokenizer (the engine's): pool threads encode prompts with it (chat_prompt,
        # the stage's prompt_ids) while the loop's thread detokenizes. A fast tokenizer encodes and
        # decodes through shared borrows; only changing its truncation or padding would take it
        # exclusively, and nothing here does, so no lock is needed.
        self.answer_events = AnswerEvents(self.emit, token_decoder(self.engine.tokenizer),
                                          int(self.cfg.server.stream_interval))
        self.observe = RequestMetrics(self.metrics, self.engine)
        self.stats_log = StatsLog(self.cfg.server.stats_interval_s, ("prompt_tokens", "generation_tokens"),
                                  generate_line)
        ids = self.engine.tokenizer.encode("Hello")[:8] or [0]
        self.engine.generate([ids], SamplingParams(max_tokens=2, temperature=0.0))  # warm-up step
        cfg, blocks = self.engine.cfg, self.engine.stats()["kv_blocks_total"]
        self.metrics.cache_config({"block_size": cfg.block_size, "num_gpu_blocks": blocks,
                                   "cache_dtype": cfg.dtype.value, "enable_prefix_caching": cfg.enable_prefix_caching})

    def default_preparer_threads(self) -> int:
        """One preparer per CPU this process may run on, at most 4: preparing is CPU work."""
        return min(4, len(os.sched_getaffinity(0)))

    # ---- requests -------------------------------------------------------------------------------
    def admit(self, uid: str, arrival: float, job: GenerateJob) -> None:
        if isinstance(job, (TokenizeJob, DetokenizeJob, TokenizerInfoJob)):
            self.tokenizing.admit(uid, job)
            return
        self.sessions[uid] = Session(job.request, arrival)
        with self.unprepared_lock:
            self.unprepared.append((uid, job))
            if self.active_preparers == self.preparer_threads:  # a busy preparer takes it with the others waiting
                return
            self.active_preparers += 1
        self.executor.submit(self._prepare_waiting)

    def _prepare_waiting(self) -> None:
        """In a preparer thread: prepare every request waiting, hand them to the loop together, and again
        until none wait. Requests prepared together join the same engine step, and on one CPU one
        preparer in turn costs less than several trading the GIL (docs/serving.md)."""
        while True:
            with self.unprepared_lock:
                batch, self.unprepared = self.unprepared, []
                if not batch:
                    self.active_preparers -= 1
                    return
            group = [(uid, job) for uid, job in batch if uid in self.sessions]  # aborted ones: nobody waits
            for message in self._prepare_group(group):
                self.post(message)

    def _prepare_group(self, group: List[Tuple[str, GenerateJob]]) -> List[Union[Prepared, Unanswerable]]:
        """Per request, its prompts for the engine or its failure. The chat requests go through the online
        head together, as a batch file's do in `appliance run` (one failing fails only itself)."""
        chats = [(uid, job) for uid, job in group if job.request.kind == "chat"]
        outputs = self.head.run_each([self._record(uid, job) for uid, job in chats])
        heads = {uid: out for (uid, _), out in zip(chats, outputs)}
        results: List[Union[Prepared, Unanswerable]] = []
        for uid, job in group:
            try:
                check_answers(job.request.n, len(job.request.prompts))
                if job.request.kind == "chat":
                    head = heads[uid]
                    if isinstance(head, Exception):
                        raise head
                    prompts = [(head["prompt"], head.get("mm_data"))]
                else:
                    prompts = [(self.stage.prompt_ids(p), None) for p in job.request.prompts]
                field = "messages" if job.request.kind == "chat" else "prompt"
                for prompt, _ in prompts:
                    self.stage.check_fits(len(prompt), job.request.sampling.get("max_tokens"), field)
                results.append(Prepared(uid, prompts))
            except Exception as e:  # noqa: BLE001 - every failure becomes the client's answer
                results.append(Unanswerable(uid, self.failure(e, "preparing the request")))
        return results

    @staticmethod
    def _record(uid: str, job: GenerateJob) -> dict:
        request = job.request
        if request.messages is None:  # parse_chat sets them
            raise RuntimeError(f"chat request {uid} came without its messages")
        return as_record(ChatRecord(request.messages, request.sampling, "messages", job.media_dir, uid, request.model,
                                    tools=request.tools, describe_tools=is_auto(request.tool_calling)))

    def on_prepared(self, message: Prepared) -> None:
        uid, prompts = message.uid, message.prompts
        session = self.sessions.get(uid)
        if session is None:  # aborted while it was being prepared
            return
        try:
            self._add_answers(uid, session, prompts)
        except InputError as e:  # the engine's own checks (cache too small, image tokens, token ids, ...)
            self.fail(uid, Failed(400, str(e), e.param))  # aborts the answers added already
            return
        if session.request.echo:
            session.echo_texts = [echo_text(p, self._detokenize) for p in session.request.prompts]
        prompt_tokens = sum(len(prompt) for prompt, _ in prompts)
        session.in_engine, session.prompt_tokens, session.unfinished = True, prompt_tokens, len(session.answers)
        self.unstarted[uid] = session
        if len(session.answers) > 1:
            self.several.add(uid)
        max_tokens = over_defaults(self.stage.options.sampling, session.request.sampling).get("max_tokens")
        self.observe.admitted(session, max_tokens, max(len(prompt) for prompt, _ in prompts))
        self.stats_log.add("prompt_tokens", prompt_tokens)
        self.emit(uid, Admitted(prompt_tokens))

    def _detokenize(self, ids: Sequence[int]) -> str:
        return self.engine.tokenizer.decode(ids, skip_special_tokens=True)

    def on_tokenized(self, message: Tokenized) -> None:
        if self.tokenizing.forget(message.uid):
            self.emit(message.uid, Done(message.result))

    def _add_answers(self, uid: str, session: Session, prompts: List[Tuple[List[int], Optional[list]]]) -> None:
        """n engine requests per prompt: its first answer, then the others as its siblings; or, with
        `use_beam_search`, one beam search per prompt whose n answers come out under those ids."""
        request = session.request
        field = "messages" if request.kind == "chat" else "prompt"
        for number, (prompt, mm_data) in enumerate(prompts):
            if request.use_beam_search:
                ids = [engine_id(uid, number * request.n + answer) for answer in range(request.n)]
                self.stage.add_beam_search(prompt, request.sampling, request.length_penalty, ids, field,
                                           mm_data=mm_data)
                session.answers.update((rid, ChoiceState(number * request.n + answer, number, len(prompt)))
                                       for answer, rid in enumerate(ids))
                continue
            first = None
            for answer in range(request.n):  # echo with logprobs: the first answer scores the prompt for all
                index = number * request.n + answer
                rid = self.stage.add_request(prompt, request.sampling, field, request_id=engine_id(uid, index),
                                             mm_data=mm_data, answer=answer, sibling=first)
                session.answers[rid] = ChoiceState(index, number, len(prompt))
                first = first or rid

    def abort(self, uid: str) -> None:
        if self.tokenizing.forget(uid):
            return
        if uid in self.sessions:
            self.forget(uid)
            self.metrics.success("abort").inc()

    def forget(self, uid: str) -> bool:
        if self.tokenizing.forget(uid):
            return True
        session = self.sessions.pop(uid, None)
        self.unstarted.pop(uid, None)
        self.several.discard(uid)
        for rid in session.answers if session is not None else ():
            self.stage.abort(rid)  # every answer: a finished one is already gone from the engine
        return session is not None

    # ---- the step -------------------------------------------------------------------------------
    def busy(self) -> bool:
        return self.stage.has_unfinished()

    def step(self) -> None:
        if self.stage.has_unfinished():
            began = time.monotonic()
            outputs = self.stage.step()
            now = time.monotonic()
            self.metrics.step_tokens.observe(self.engine.step_tokens)
            if self.unstarted:
                self.observe.started(self.unstarted, began, (request_of(out.request_id) for out in outputs))
            new_tokens = started_prompts = 0
            delivered = [(self.sessions.get(request_of(out.request_id)), out) for out in outputs]
            for session, out in delivered:  # first the prompts scored for echo: their siblings' text starts with them
                if session is not None and out.prompt_logprobs is not None:
                    self.answer_events.score_prompt(session, out)
            for session, out in delivered:
                if session is not None:
                    new_tokens += len(out.new_token_ids)
                    answer = session.answers[out.request_id]
                    if out.new_token_ids and not answer.completion_tokens:  # its first token (vLLM's prefill)
                        started_prompts += answer.prompt_tokens
                    self._deliver(request_of(out.request_id), session, out, now)
            if new_tokens:  # counted once a step: a multiprocess counter's increment writes a mapped file
                self.metrics.generation_tokens.inc(new_tokens)
                self.stats_log.add("generation_tokens", new_tokens)
            if self.metrics.vllm_step_tokens is not None and outputs:
                self.metrics.vllm_step_tokens.observe(started_prompts + new_tokens)
        self.publish()

    def _deliver(self, uid: str, session: Session, out, now: float) -> None:
        answer = session.answers[out.request_id]
        n = len(out.new_token_ids)
        if n:
            self.observe.tokens(session, answer, now)
            answer.completion_tokens += n
            session.completion_tokens += n
        if out.finished:
            session.unfinished -= 1
        final = session.unfinished == 0
        self.answer_events.output(uid, session, answer, out, final)
        if final:
            del self.sessions[uid]
            self.several.discard(uid)
            self.observe.finished(session, answer, out.finish_reason, now)

    def publish(self) -> None:
        """The running count the HTTP side reads (every turn), then the Prometheus gauges, and the stats
        line when it is due."""
        stats = self.engine.stats()
        running = self.running_requests(stats["num_running"])
        self.shared.set_running(running)
        self.observe.publish(stats, self.sessions)
        now = time.monotonic()
        if self.stats_log.due(now):
            self.stats_log.write(now, {"running": running, "waiting": waiting(stats, self.sessions),
                                       "kv_cache_usage": kv_usage(stats)})

    def running_requests(self, sequences: int) -> int:
        """Requests with an answer running: the HTTP side's admission subtracts them from its open
        requests to count the queued ones (server.limits.max_queued_requests). The running sequences
        while every request in the engine has one answer; else the distinct requests among them, a
        pass over the running sequences only (never over every session)."""
        if not self.several:
            return sequences
        return len({request_of(rid) for rid in self.engine.running_ids()})

    def fail_all(self, failure: Failed) -> None:
        for uid in [*self.sessions, *self.tokenizing.pending]:
            self.fail(uid, failure)

    def fail_stepping(self, failure: Failed) -> None:
        for uid in [uid for uid, s in self.sessions.items() if s.in_engine]:
            self.fail(uid, failure)  # aborting frees the blocks the failed step had allocated


def is_auto(calling) -> bool:
    """The model chooses whether to call a tool (tool_choice "auto"): it must be told how."""
    return calling is not None and calling.mode == "auto"


def check_answers(n: int, prompts: int) -> None:
    """InputError when a completion request asks more than MAX_ANSWERS answers in all."""
    if n * prompts > MAX_ANSWERS:
        raise InputError(f"prompt: {prompts} prompts x n={n} are {n * prompts} answers; a request may ask at "
                         f"most {MAX_ANSWERS}: send the prompts in several requests", param="prompt")
