"""Prometheus metrics, in prometheus-client's multiprocess mode.

The engine loop (LitServe's inference worker) and the HTTP process are two processes: each writes its
samples to memory-mapped files under $PROMETHEUS_MULTIPROC_DIR and `/metrics` merges them
(`MultiProcessCollector`). prometheus-client picks its value store when it is first imported, so
`appliance serve` sets that variable before anything imports it (`multiprocess_dir`). Metric objects
belong to the `EngineMetrics` / `HttpMetrics` instance that uses them (no default registry).

Names follow vLLM's, prefixed `appliance_`, every series labelled `model_name`. With
`server.metrics_names: vllm` (`MetricNames`) the series vLLM has are exported under vLLM's own names
(`vllm:time_to_first_token_seconds`, ...), so dashboards and autoscaler triggers made for vLLM work
unchanged; the series vLLM lacks (tiles, encoder cache, HTTP requests, pool outcomes) keep theirs.
"""
import os
import shutil
import tempfile
from contextlib import contextmanager
from typing import Any, Dict, Iterator, Optional, Tuple

from appliance.config.schema import MetricsNames

LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                   40.0, 80.0, 160.0, 640.0)
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
# Tokens per request: 1, 2, 5, 10, ... 500,000 (vLLM's 1-2-5 steps; past the largest context, +Inf).
TOKEN_BUCKETS = tuple(m * 10 ** e for e in range(6) for m in (1, 2, 5))
# Tokens one engine step computes: powers of two up to 16,384 (vLLM's, minus its CUDA-graph sizes).
# Answers per prompt (`n`, at most 128): vLLM's 1-2-5 steps.
N_BUCKETS = (1, 2, 5, 10, 20, 50, 100)
STEP_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
ENV = "PROMETHEUS_MULTIPROC_DIR"
# The series vLLM exports too, named as ours without the prefix (vLLM's v1 engine, `vllm:` names).
VLLM_SERIES = frozenset({
    "time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
    "request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
    "request_inference_time_seconds", "request_time_per_output_token_seconds", "request_prompt_tokens",
    "request_generation_tokens", "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
    "prompt_tokens", "generation_tokens", "request_success", "num_preemptions", "prefix_cache_queries",
    "prefix_cache_hits", "request_params_max_tokens", "iteration_tokens_total", "cache_config_info",
    "request_params_n", "request_max_num_generation_tokens"})
CACHE_INFO_LABELS = ("block_size", "num_gpu_blocks", "cache_dtype", "enable_prefix_caching")  # vLLM's names


class MetricNames:
    """`server.metrics_names`: `appliance` names every series `appliance_<name>`; `vllm` names the series
    vLLM has `vllm:<name>` and the others `appliance_<name>`."""

    def __init__(self, scheme: MetricsNames = MetricsNames.appliance):
        self.scheme = scheme

    def __call__(self, name: str) -> str:
        return f"vllm:{name}" if self.scheme is MetricsNames.vllm and name in VLLM_SERIES else f"appliance_{name}"


@contextmanager
def multiprocess_dir() -> Iterator[str]:
    """$PROMETHEUS_MULTIPROC_DIR for this server: the caller's if set (kept), else a fresh temp directory
    (removed on exit). Must run before prometheus_client is imported in this process."""
    given = os.environ.get(ENV)
    if given:
        os.makedirs(given, exist_ok=True)
        yield given
        return
    path = tempfile.mkdtemp(prefix="appliance-metrics-")
    os.environ[ENV] = path
    try:
        yield path
    finally:
        os.environ.pop(ENV, None)
        shutil.rmtree(path, ignore_errors=True)


def _check_multiprocess() -> None:
    from prometheus_client import values

    if ENV not in os.environ or values.ValueClass.__name__ != "MmapedValue":
        raise RuntimeError("prometheus_client was imported before $PROMETHEUS_MULTIPROC_DIR was set; "
                           "metrics from the engine process would be lost")


class EngineMetrics:
    """Written by the engine loop."""

    def __init__(self, model_name: str, names: Optional[MetricNames] = None):
        from prometheus_client import Counter, Gauge, Histogram

        _check_multiprocess()
        names = names or MetricNames()
        labels = ["model_name"]

        def histogram(name, doc, buckets=LATENCY_BUCKETS):
            return Histogram(names(name), doc, labels, buckets=buckets, registry=None).labels(model_name)

        def counter(name, doc):
            return Counter(names(name), doc, labels, registry=None).labels(model_name)

        def gauge(name, doc):
            return Gauge(names(name), doc, labels, registry=None, multiprocess_mode="livemostrecent").labels(model_name)

        self.ttft = histogram("time_to_first_token_seconds", "Arrival to first output token")
        self.itl = histogram("inter_token_latency_seconds", "Between consecutive output tokens", ITL_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "Arrival to the last output (or pool result)")
        self.queue = histogram("request_queue_time_seconds", "Arrival to the first engine step that runs it")
        # Per finished request (stop or length), as vLLM's request-level histograms.
        self.prefill = histogram("request_prefill_time_seconds", "First engine step that ran it to its first token")
        self.decode = histogram("request_decode_time_seconds", "First output token to the last")
        self.inference = histogram("request_inference_time_seconds", "First engine step that ran it to its last "
                                   "token")
        self.tpot = histogram("request_time_per_output_token_seconds", "Decode time per output token after the "
                              "first (requests with two or more)", ITL_BUCKETS)
        self.request_prompt_tokens = histogram("request_prompt_tokens", "Prompt tokens of a finished request, "
                                               "image tokens included", TOKEN_BUCKETS)
        self.request_generation_tokens = histogram("request_generation_tokens", "Output tokens of a finished "
                                                   "request", TOKEN_BUCKETS)
        self.max_tokens = histogram("request_params_max_tokens", "max_tokens of an admitted request (left out: "
                                    "what the context leaves)", TOKEN_BUCKETS)
        self.params_n = histogram("request_params_n", "n (answers per prompt) of a finished request", N_BUCKETS)
        self.max_generation_tokens = histogram("request_max_num_generation_tokens", "Output tokens of a finished "
                                               "request's longest answer", TOKEN_BUCKETS)
        # Ours keeps its name under either scheme: what a step computed (prefix-cache hits are not computed).
        self.step_tokens = Histogram("appliance_iteration_tokens_total", "Tokens one engine step computed: prompt "
                                     "tokens run (prefix-cache hits left out) and output", labels,
                                     buckets=STEP_BUCKETS, registry=None).labels(model_name)
        # vLLM's, under its name only: per step with output, the whole prompt of each answer that got its
        # first token plus the tokens generated (its metrics test: n requests sum to n * (prompt + output)).
        self.vllm_step_tokens = histogram("iteration_tokens_total", "Per engine step with output: prompt tokens "
                                          "of the answers it started (cache hits included) plus the tokens it "
                                          "generated", STEP_BUCKETS) if names.scheme is MetricsNames.vllm else None
        self._cache_info = Gauge(names("cache_config_info"), "The KV cache's configuration (value 1)",
                                 ["model_name", *CACHE_INFO_LABELS], registry=None, multiprocess_mode="mostrecent")
        self.running = gauge("num_requests_running", "Requests the engine is running")
        self.waiting = gauge("num_requests_waiting", "Requests accepted, not yet running")
        self.kv_usage = gauge("kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0-1)")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of admitted requests, image tokens included")
        self.generation_tokens = counter("generation_tokens", "Output tokens")
        self.preemptions = counter("num_preemptions", "Sequences preempted (recomputed later)")
        self.prefix_queries = counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache")
        self.prefix_hits = counter("prefix_cache_hits", "Prompt tokens found in the prefix cache")
        self.encoder_queries = counter("encoder_cache_queries", "Images looked up in the encoder cache")
        self.encoder_hits = counter("encoder_cache_hits", "Images found in the encoder cache")
        self.tiles = counter("tiles", "Tiles run by the pooling engine")
        self._success = Counter(names("request_success"), "Finished requests by finish reason",
                                ["model_name", "finished_reason"], registry=None)
        self._pool = Counter("appliance_pool_requests", "Pool (GeoTIFF) requests by outcome",
                             ["model_name", "outcome"], registry=None)
        self.model_name = model_name

    def cache_config(self, info: Dict[str, Any]) -> None:
        """vLLM's cache_config_info: the cache's settings as labels (`CACHE_INFO_LABELS`), value 1."""
        self._cache_info.labels(self.model_name, *(str(info[label]) for label in CACHE_INFO_LABELS)).set(1)

    def success(self, reason: str):
        return self._success.labels(self.model_name, reason)

    def pool_request(self, outcome: str):
        return self._pool.labels(self.model_name, outcome)


class HttpMetrics:
    """Written by the HTTP process."""

    def __init__(self, model_name: str):
        from prometheus_client import Counter

        _check_multiprocess()
        self._requests = Counter("appliance_http_requests", "HTTP requests by route and status",
                                 ["model_name", "route", "status"], registry=None)
        self.model_name = model_name
        # (route, status) -> its counter: `labels()` takes a lock and builds a key each call
        self._series: Dict[Tuple[str, int], Any] = {}

    def request(self, route: str, status: int) -> None:
        series = self._series.get((route, status))
        if series is None:
            series = self._series[route, status] = self._requests.labels(self.model_name, route, str(status))
        series.inc()


def render() -> bytes:
    """Every process's samples, merged, in the text exposition format."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    return generate_latest(registry)
