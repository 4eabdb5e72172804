"""The Grafana dashboard queries only what the server exports: the series of appliance/serving/metrics.py,
named as prometheus-client writes them (`_total` counters, `_bucket`/`_sum`/`_count` histograms), with
their labels."""
import json
import re
import subprocess
import sys
from typing import Dict, Set

from appliance.serving.metrics import VLLM_SERIES
from tests.helm.conftest import CHART, REPO, render_files

# Every metric of EngineMetrics and HttpMetrics touched once, then /metrics' text parsed back.
EXPORT = """
import json, os, tempfile
os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp()
from prometheus_client.parser import text_string_to_metric_families
from appliance.serving.metrics import EngineMetrics, HttpMetrics, render

engine = EngineMetrics("m")
for attribute, metric in vars(engine).items():
    if attribute.startswith("_"):  # labelled by reason / outcome: below
        continue
    for method in ("observe", "set", "inc"):
        if hasattr(metric, method):
            getattr(metric, method)(1)
            break
engine.success("stop").inc()
engine.pool_request("success").inc()
HttpMetrics("m").request("/v1/models", 200)
series = {}
for family in text_string_to_metric_families(render().decode()):
    for sample in family.samples:
        series.setdefault(sample.name, set()).update(sample.labels)
print(json.dumps({name: sorted(labels) for name, labels in series.items()}))
"""
PROMQL_WORDS = {"sum", "by", "rate", "histogram_quantile", "max", "clamp_min", "le", "label_values"}
DASHBOARD = json.loads((CHART / "dashboards" / "appliance.json").read_text())


def exported() -> Dict[str, Set[str]]:
    done = subprocess.run([sys.executable, "-c", EXPORT], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return {name: set(labels) for name, labels in json.loads(done.stdout).items()}


def queries(node):
    """Every PromQL expression in the dashboard: panel targets and template variable queries."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "definition") and isinstance(value, str):
                yield value
            elif key == "query" and isinstance(value, str) and "(" in value:
                yield value
            else:
                yield from queries(value)
    elif isinstance(node, list):
        for value in node:
            yield from queries(value)


def test_every_queried_metric_and_label_is_exported():
    series = exported()
    assert "appliance_time_to_first_token_seconds_bucket" in series and "appliance_tiles_total" in series
    found = list(queries(DASHBOARD))
    assert len(found) >= 20
    used = set()
    for expr in found:
        metrics = set(re.findall(r"\bappliance_\w+", expr))
        assert metrics, f"no appliance metric in {expr}"
        unknown = metrics - series.keys()
        assert not unknown, f"{expr}: not exported: {unknown}"
        used |= metrics
        labels = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)\s*\"", expr))  # matchers
        for group in re.findall(r"by \(([^)]*)\)", expr):
            labels |= {label.strip() for label in group.split(",")}
        labels |= set(re.findall(r"label_values\(\w+,\s*(\w+)\)", expr))
        allowed = set().union(*(series[m] for m in metrics))
        assert labels <= allowed, f"{expr}: labels {labels - allowed} not on {metrics}"
    # TTFT, ITL, throughput, queue, KV usage, cache hit rates, tiles/s: what an operator watches.
    for name in ("appliance_time_to_first_token_seconds_bucket", "appliance_inter_token_latency_seconds_bucket",
                 "appliance_generation_tokens_total", "appliance_num_requests_waiting", "appliance_kv_cache_usage_perc",
                 "appliance_prefix_cache_hits_total", "appliance_encoder_cache_hits_total", "appliance_tiles_total"):
        assert name in used, name


def test_the_autoscaler_metric_is_exported(chart):
    assert "appliance_num_requests_waiting" in exported()
    hpa = render_files(chart, {"autoscaling": {"enabled": True}})["appliance/templates/hpa.yaml"]
    assert "name: appliance_num_requests_waiting" in hpa


def test_the_charts_vllm_series_are_the_servers():
    """metrics.names=vllm renames in the chart exactly the series the server renames."""
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    block = helpers.split('define "appliance.vllmSeries"')[1].split("{{- end -}}")[0]
    assert set(re.findall(r'"(\w+)"', block)) == VLLM_SERIES


def test_dashboard_is_well_formed():
    ids = [panel["id"] for panel in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    for panel in DASHBOARD["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
