"""When the engine loop writes its gauges: the running count the HTTP side reads on every turn; the
Prometheus gauges and mirrored counters at once when the engine is idle, and at most every
GAUGES_INTERVAL_S while it runs (each is a write to a memory-mapped file, and the loop turns ~50 times
a second under load). The served values themselves are checked against a real server in
test_metrics.py and tests/reliability."""
import time
from types import SimpleNamespace

from appliance.serving.engine_process.generate_driver import GenerateDriver
from appliance.serving.engine_process.stats_log import StatsLog, generate_line
from appliance.serving.engine_process.request_metrics import GAUGES_INTERVAL_S, RequestMetrics


class Recorded:
    def __init__(self):
        self.values = []

    def set(self, value):
        self.values.append(value)

    def inc(self, amount=1):
        self.values.append(amount)


class StubEngine:
    def __init__(self):
        self.busy = True
        self.counts = {"num_running": 3, "num_waiting": 1, "kv_blocks_total": 10, "kv_blocks_free": 6,
                       "num_preemptions": 0, "prefix_cache_query_tokens": 0, "prefix_cache_hit_tokens": 0}

    def stats(self):
        return dict(self.counts)

    def has_unfinished(self):
        return self.busy


class StubStage:
    """The engine stage the driver holds: it steps and asks the engine through it."""

    def __init__(self, engine):
        self.engine = engine

    def has_unfinished(self):
        return self.engine.has_unfinished()


def stub_worker(engine=None):
    cfg = SimpleNamespace(server=SimpleNamespace(preprocess_workers=1))
    metrics = SimpleNamespace(**{name: Recorded() for name in (
        "running", "waiting", "kv_usage", "preemptions", "prefix_queries", "prefix_hits", "encoder_hits",
        "encoder_queries")})
    shared = SimpleNamespace(running=[], set_running=lambda n: shared.running.append(n))
    worker = GenerateDriver(cfg, online=None, metrics=metrics, shared=shared)
    worker.stage = StubStage(engine or StubEngine())
    worker.engine = worker.stage.engine  # start() takes it from the stage
    worker.observe = RequestMetrics(metrics, worker.engine)
    worker.stats_log = StatsLog(0, ("prompt_tokens", "generation_tokens"), generate_line)  # no stats line
    worker.several = set()
    worker.sessions = {uid: SimpleNamespace(in_engine=True) for uid in "abcd"}  # 3 running, 1 waiting
    return worker


def test_a_busy_engine_writes_its_gauges_at_most_once_an_interval_and_the_running_count_every_turn():
    worker = stub_worker()
    worker.publish()
    worker.stage.engine.counts.update(num_running=4, kv_blocks_free=5, prefix_cache_query_tokens=32)
    worker.publish()  # within the interval: only the running count
    assert worker.shared.running == [3, 4]
    assert worker.metrics.running.values == [3] and worker.metrics.kv_usage.values == [0.4]
    assert worker.metrics.prefix_queries.values == []
    time.sleep(GAUGES_INTERVAL_S * 1.2)
    worker.publish()
    assert worker.metrics.running.values == [3, 4] and worker.metrics.kv_usage.values == [0.4, 0.5]
    assert worker.metrics.prefix_queries.values == [32]  # the mirror caught up with the engine's count
    worker.executor.shutdown()


def test_an_idle_engine_writes_its_gauges_at_once():
    worker = stub_worker()
    worker.publish()
    worker.stage.engine.busy = False
    worker.stage.engine.counts.update(num_running=0, num_waiting=0, kv_blocks_free=10)
    worker.sessions.clear()
    worker.publish()  # the last request just finished: /metrics must show the engine idle now
    assert worker.metrics.running.values == [3, 0] and worker.metrics.waiting.values == [1, 0]
    assert worker.metrics.kv_usage.values == [0.4, 0.0]
    worker.executor.shutdown()


class SeveralAnswersEngine(StubEngine):
    """Three running sequences: two answers of request a, one of b."""

    def running_ids(self):
        return ["a/0", "a/1", "b/0"]


def test_the_running_count_is_of_requests_once_a_request_has_several_answers():
    """The HTTP side counts queued requests as its open ones minus this count, so it must count
    requests, not their answers (server.limits.max_queued_requests with n > 1)."""
    worker = stub_worker(SeveralAnswersEngine())
    worker.publish()
    assert worker.shared.running == [3]  # every request in the engine has one answer: the sequences
    worker.several.add("a")
    worker.publish()
    assert worker.shared.running == [3, 2]
    worker.executor.shutdown()
