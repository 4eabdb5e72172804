"""The request line, the stats line and the JSON formatter, without a server."""
import json
import logging
import os

import pytest

from appliance.config.schema import LogFormat
from appliance.errors import ConfigError
from appliance.logs import JsonFormatter, QuietLibraryRoot, setup_logging
from appliance.serving.engine_process.stats_log import StatsLog, generate_line, pool_line
from appliance.serving.http.access_log import AccessLog, printable, request_line


@pytest.mark.parametrize("fields, line", [
    ({"method": "POST", "path": "/v1/chat/completions", "status": 200, "duration_ms": 153.25,
      "request_id": "chatcmpl-1", "prompt_tokens": 12, "completion_tokens": 40, "client": "10.0.0.7"},
     "POST /v1/chat/completions 200 153.2 ms request_id=chatcmpl-1 prompt_tokens=12 completion_tokens=40 "
     "client=10.0.0.7"),
    ({"method": "GET", "path": "/health", "status": 503, "duration_ms": 0.4, "request_id": "req-2"},
     "GET /health 503 0.4 ms request_id=req-2"),
])
def test_request_line(fields, line):
    assert request_line(fields) == line


def test_a_path_cannot_forge_a_second_line():
    assert printable("/v1/models/x\nINFO fake") == "/v1/models/x\\nINFO fake"
    assert printable("/v1/models/état") == "/v1/models/état"


def test_the_access_log_reads_what_routes_left_in_the_scope_state(caplog):
    scope = {"method": "POST", "path": "/pooling", "client": ("127.0.0.1", 5000),
             "query_string": b"api_key=secret", "headers": [(b"authorization", b"Bearer secret")],
             "state": {"request_id": "pool-9", "tiles": 4}}
    with caplog.at_level(logging.INFO, logger="appliance.access"):
        AccessLog().write(scope, 200, began=0.0)
    record = caplog.records[-1]
    assert record.fields["request_id"] == "pool-9" and record.fields["tiles"] == 4
    assert record.getMessage().startswith("POST /pooling 200 ") and "secret" not in record.getMessage()
    assert "prompt_tokens" not in record.fields


@pytest.mark.parametrize("method, path, level", [
    ("GET", "/health", logging.DEBUG),
    ("GET", "/ready", logging.DEBUG),
    ("GET", "/metrics", logging.DEBUG),
    ("HEAD", "/ready", logging.DEBUG),
    ("GET", "/v1/models", logging.INFO),
    ("GET", "/", logging.INFO),
    ("POST", "/v1/scenes", logging.INFO),
    ("POST", "/metrics", logging.INFO),  # not a poll: a 405 worth seeing
])
def test_polls_are_debug_lines_and_other_requests_info(caplog, method, path, level):
    with caplog.at_level(logging.DEBUG, logger="appliance.access"):
        AccessLog().write({"method": method, "path": path}, 200, began=0.0)
    assert [r.levelno for r in caplog.records] == [level]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="appliance.access"):
        AccessLog().write({"method": method, "path": path}, 200, began=0.0)
    assert len(caplog.records) == (level >= logging.INFO)


LITSERVE_FILE = os.path.join("site-packages", "litserve", "loops", "loops.py")


@pytest.mark.parametrize("name, level, path, shown", [
    ("root", logging.INFO, LITSERVE_FILE, False),  # "LitServe will use ApplianceSpec spec"
    ("root", logging.WARNING, LITSERVE_FILE, True),
    ("root", logging.INFO, __file__, True),  # the root logger's other lines
    ("litserve", logging.ERROR, LITSERVE_FILE, True),
])
def test_litserves_lines_on_the_root_logger_are_held_to_its_level(name, level, path, shown):
    record = logging.LogRecord(name, level, os.path.join(os.sep, "venv", path), 1, "a line", None, None)
    assert QuietLibraryRoot().filter(record) is shown


def test_json_lines_carry_the_fields_as_keys():
    record = logging.LogRecord("appliance.access", logging.INFO, __file__, 1, "GET /health 200 0.4 ms", None, None)
    record.fields = {"method": "GET", "status": 200}
    line = json.loads(JsonFormatter().format(record))
    assert line["level"] == "INFO" and line["logger"] == "appliance.access" and line["message"].startswith("GET")
    assert line["method"] == "GET" and line["status"] == 200 and "T" in line["time"]


def test_an_unknown_log_level_is_a_config_error():
    with pytest.raises(ConfigError, match="log_level: 'LOUD'; allowed: DEBUG, INFO"):
        setup_logging("LOUD", LogFormat.text)


def stats_records(caplog, log, *turns):
    """Drive `log` through (now, gauges) turns; the messages it wrote."""
    with caplog.at_level(logging.INFO, logger="appliance.stats"):
        caplog.clear()
        for now, gauges in turns:
            if log.due(now):
                log.write(now, gauges)
    return [r for r in caplog.records if r.name == "appliance.stats"]


def test_the_stats_line_is_written_per_interval_only_when_something_happened(caplog):
    log = StatsLog(10, ("prompt_tokens", "generation_tokens"), generate_line)
    start = log.since
    idle = {"running": 0, "waiting": 0, "kv_cache_usage": 0.0}
    assert stats_records(caplog, log, (start + 5, idle), (start + 10, idle), (start + 25, idle)) == []
    log.add("prompt_tokens", 300)
    log.add("generation_tokens", 50)
    records = stats_records(caplog, log, (start + 30, idle), (start + 35, idle),
                            (start + 45, {"running": 2, "waiting": 1, "kv_cache_usage": 0.125}), (start + 55, idle))
    assert [r.getMessage() for r in records] == [
        "prompt throughput: 30.0 tokens/s, generation throughput: 5.0 tokens/s, running: 0 reqs, waiting: 0 reqs, "
        "KV cache usage: 0.0%",
        "prompt throughput: 0.0 tokens/s, generation throughput: 0.0 tokens/s, running: 2 reqs, waiting: 1 reqs, "
        "KV cache usage: 12.5%"]
    assert records[1].fields == {"prompt_tokens_per_s": 0.0, "generation_tokens_per_s": 0.0, "running": 2,
                                 "waiting": 1, "kv_cache_usage_pct": 12.5}


def test_a_pool_stats_line_and_interval_zero_means_never(caplog):
    log = StatsLog(2, ("tiles",), pool_line)
    log.add("tiles", 8)
    records = stats_records(caplog, log, (log.since + 2, {"running": 1, "waiting": 3}))
    assert [r.getMessage() for r in records] == ["tile throughput: 4.0 tiles/s, running: 1 reqs, waiting: 3 reqs"]
    never = StatsLog(0, ("tiles",), pool_line)
    never.add("tiles", 8)
    assert not never.due(never.since + 1e9)


def test_litserves_and_uvicorns_loggers_go_to_ours():
    """LitServer.run() configures LitServe's logger (its own handler and format, not propagating), as
    uvicorn's default log config does its loggers; the spec's setup hook undoes both."""
    import litserve

    from appliance.logs import adopt_library_loggers

    litserve.configure_logging("INFO")
    logging.getLogger("uvicorn.error").addHandler(logging.NullHandler())
    adopt_library_loggers()
    for name in ("litserve", "uvicorn.error"):
        logger = logging.getLogger(name)
        assert logger.handlers == [] and logger.propagate
    assert logging.getLogger("litserve").level == logging.WARNING
