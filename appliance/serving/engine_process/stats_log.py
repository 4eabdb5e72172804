"""The engine's periodic line (vLLM's "Avg prompt throughput ..."): every `server.stats_interval_s`
(0: never) the engine loop's driver writes, on the `appliance.stats` logger at INFO, what its engine did
in the interval and its queue now; an interval with nothing done and nothing running or waiting writes
nothing, so an idle server stays quiet.

Generate engines: prompt and generation tokens/s, requests running and waiting, KV-cache use. Pool
engines: tiles/s, requests running and waiting. The driver counts into the line (`add`) as it counts
for /metrics, and checks once a loop turn whether the line is due (`due`); the gauges are read only then.
"""
import logging
import time
from typing import Any, Callable, Dict, Iterable, Tuple

LOGGER = "appliance.stats"
Describe = Callable[[Dict[str, int], float, Dict[str, Any]], Tuple[str, Dict[str, Any]]]


class StatsLog:
    def __init__(self, interval_s: float, counts: Iterable[str], describe: Describe):
        """`counts`: what the driver adds up between lines; `describe(counts, seconds, gauges)`: the
        line's message and its fields (for log_format=json)."""
        self.interval_s = float(interval_s)
        self.describe = describe
        self.counts = dict.fromkeys(counts, 0)
        self.since = time.monotonic()
        self.due_at = self.since + self.interval_s if self.interval_s > 0 else float("inf")
        self.log = logging.getLogger(LOGGER)

    def add(self, key: str, n: int) -> None:
        self.counts[key] += n

    def due(self, now: float) -> bool:
        return now >= self.due_at

    def write(self, now: float, gauges: Dict[str, Any]) -> None:
        """The interval's line, unless nothing happened and nothing is running or waiting; starts the
        next interval. `gauges`: at least `running` and `waiting`."""
        if any(self.counts.values()) or gauges["running"] or gauges["waiting"]:
            message, fields = self.describe(self.counts, now - self.since, gauges)
            self.log.info(message, extra={"fields": fields})
        self.counts = dict.fromkeys(self.counts, 0)
        self.since, self.due_at = now, now + self.interval_s


def generate_line(counts: Dict[str, int], seconds: float, gauges: Dict[str, Any]) -> Tuple[str, Dict[str, Any]]:
    fields = {"prompt_tokens_per_s": round(counts["prompt_tokens"] / seconds, 1),
              "generation_tokens_per_s": round(counts["generation_tokens"] / seconds, 1),
              "running": gauges["running"], "waiting": gauges["waiting"],
              "kv_cache_usage_pct": round(100 * gauges["kv_cache_usage"], 1)}
    return (f"prompt throughput: {fields['prompt_tokens_per_s']:.1f} tokens/s, generation throughput: "
            f"{fields['generation_tokens_per_s']:.1f} tokens/s, running: {fields['running']} reqs, waiting: "
            f"{fields['waiting']} reqs, KV cache usage: {fields['kv_cache_usage_pct']:.1f}%"), fields


def pool_line(counts: Dict[str, int], seconds: float, gauges: Dict[str, Any]) -> Tuple[str, Dict[str, Any]]:
    fields = {"tiles_per_s": round(counts["tiles"] / seconds, 1), "running": gauges["running"],
              "waiting": gauges["waiting"]}
    return (f"tile throughput: {fields['tiles_per_s']:.1f} tiles/s, running: {fields['running']} reqs, "
            f"waiting: {fields['waiting']} reqs"), fields
