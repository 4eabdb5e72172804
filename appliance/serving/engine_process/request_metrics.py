"""What the generation loop tells Prometheus: one observation per event of a request's life (admitted,
first step, each output token, finished) and, every turn, the gauges and counters that mirror the
engine's own. `RequestMetrics` keeps only the timestamps those observations need; the requests
themselves belong to `GenerateDriver`.
"""
import time
from typing import Dict, Iterable, Optional

from appliance.serving.engine_process.sessions import ChoiceState, Session, engine_id

# While the engine runs, how often its gauges are written: each write goes to a memory-mapped file
# (prometheus-client's multiprocess mode) and costs the loop CPU, the loop turns many times a second
# under load, and Prometheus scrapes only every few seconds (docs/serving.md).
GAUGES_INTERVAL_S = 0.1


class RequestMetrics:
    def __init__(self, metrics, engine):
        self.metrics = metrics  # serving.metrics.EngineMetrics
        self.engine = engine
        self.counted: Dict[str, int] = {}  # the engine's counters as last mirrored
        self.gauges_due = 0.0  # time.monotonic() after which a busy engine's gauges are written again

    def admitted(self, session: Session, max_tokens: Optional[int], longest_prompt: int) -> None:
        """The request is in the engine: its prompt tokens (each prompt once) and its max_tokens (left
        out: what the context leaves after its longest prompt)."""
        self.metrics.prompt_tokens.inc(session.prompt_tokens)
        self.metrics.max_tokens.observe(max_tokens or self.engine.max_model_len - longest_prompt)

    def started(self, unstarted: Dict[str, Session], began: float, stepped: Iterable[str]) -> None:
        """Queue time (arrival to the start of the first step that ran it) of the requests this step ran
        first: those with output in it (`stepped`: finished ones among them) and those running now (a
        prefill in chunks has no output yet). Run before the outputs are delivered, so a request that
        finishes in its first step has its start. Removes them from `unstarted`."""
        stepped = set(stepped)
        started = [uid for uid in unstarted if uid in stepped or self.engine.is_running(engine_id(uid, 0))]
        for uid in started:
            session = unstarted.pop(uid)
            session.started_at = began
            self.metrics.queue.observe(began - session.arrival)

    def tokens(self, session: Session, answer: ChoiceState, now: float) -> None:
        """An answer got tokens this step (before its counts are updated): the request's first token
        (TTFT) or the time since the answer's last one (ITL)."""
        if session.completion_tokens == 0:
            self.metrics.ttft.observe(now - session.arrival)
            session.first_token_at = now
        elif answer.completion_tokens:
            self.metrics.itl.observe(now - answer.last_token_at)
        answer.last_token_at = now

    def finished(self, session: Session, last: ChoiceState, reason: str, now: float) -> None:
        """vLLM's request-level series: latency split into queue, prefill and decode, token counts,
        `n` and the longest answer's tokens (success once a request, under its last answer's
        reason; time per token of that answer)."""
        metrics = self.metrics
        metrics.e2e.observe(now - session.arrival)
        metrics.success(reason).inc()
        metrics.request_prompt_tokens.observe(session.prompt_tokens)
        metrics.request_generation_tokens.observe(session.completion_tokens)
        metrics.params_n.observe(session.request.n)
        metrics.max_generation_tokens.observe(max(a.completion_tokens for a in session.answers.values()))
        metrics.inference.observe(now - session.started_at)
        if session.completion_tokens:
            metrics.prefill.observe(session.first_token_at - session.started_at)
            metrics.decode.observe(now - session.first_token_at)
            if last.completion_tokens > 1:
                metrics.tpot.observe((now - session.first_token_at) / (last.completion_tokens - 1))

    def publish(self, stats: dict, sessions: Dict[str, Session]) -> None:
        """Gauges and counters that mirror the engine's own `stats`: at once when the engine is idle,
        else at most every GAUGES_INTERVAL_S. `sessions`: the requests accepted, in the engine or not."""
        now = time.monotonic()
        if now < self.gauges_due and self.engine.has_unfinished():
            return
        self.gauges_due = now + GAUGES_INTERVAL_S
        self.metrics.running.set(stats["num_running"])
        self.metrics.waiting.set(waiting(stats, sessions))
        self.metrics.kv_usage.set(kv_usage(stats))
        for counter, key in ((self.metrics.preemptions, "num_preemptions"),
                             (self.metrics.prefix_queries, "prefix_cache_query_tokens"),
                             (self.metrics.prefix_hits, "prefix_cache_hit_tokens"),
                             (self.metrics.encoder_hits, "encoder_cache_hits")):
            self._mirror(counter, key, stats.get(key, 0))
        lookups = stats.get("encoder_cache_hits", 0) + stats.get("encoder_cache_misses", 0)
        self._mirror(self.metrics.encoder_queries, "encoder_cache_lookups", lookups)

    def _mirror(self, counter, key: str, value: int) -> None:
        delta = value - self.counted.get(key, 0)
        if delta > 0:
            counter.inc(delta)
        self.counted[key] = value


def waiting(stats: dict, sessions: Dict[str, Session]) -> int:
    """Queued in the engine (an answer of a request asking n of them counts alone), or still preparing."""
    return stats["num_waiting"] + sum(not s.in_engine for s in sessions.values())


def kv_usage(stats: dict) -> float:
    """The fraction of the KV cache's blocks in use (0-1)."""
    total = stats["kv_blocks_total"]
    return (total - stats["kv_blocks_free"]) / total if total else 0.0
