"""Schemathesis (`st run`, its command line: the one runner that gives every check what it needs) against
both kinds of server, generate and pooling: every operation of the server's own OpenAPI document, in
positive and negative mode, through all four phases (examples, coverage, fuzzing, stateful: a scene is
created, read, its files fetched, deleted, then read again) with every check schemathesis has (turned
on in its config, `fuzz_config`). The GeoTIFF routes get real scenes and their mutations (fuzz_hooks.py). No 5xx, every
answer as documented, every refusal of a valid request or acceptance of an invalid one a failure, but
for the few checks no schema can judge: `CANNOT_JUDGE`, each with why, turned off for that operation only.
A bounded, deterministic number of examples per operation and phase: one to three minutes a server.

(schemathesis' own pytest plugin does not load on pytest 9 here, hence its command line.)
"""
import json
import os
import subprocess
import sys

import httpx

from tests.conftest import REPO
from tests.servers import API_KEY

EXAMPLES = 10  # per operation and phase
# (method, path, check) -> why schemathesis cannot judge it there; the check runs everywhere else. Each is
# positive_data_acceptance (a request the document allows must be served): these refusals depend on the
# model, the network or a file's bytes, which no schema of the request can state.
MODEL_LIMITS = "a prompt plus max_tokens past the model's context, token ids past its vocabulary"
MEDIA = "an image URL that does not answer, a local path the server does not allow"
CANNOT_JUDGE = {
    ("POST", "/v1/chat/completions", "positive_data_acceptance"): f"{MODEL_LIMITS}; {MEDIA}",
    ("POST", "/v1/completions", "positive_data_acceptance"):
        f"{MODEL_LIMITS}; best_of equal to n and min_tokens <= max_tokens (JSON Schema compares no two fields)",
    ("POST", "/tokenize", "positive_data_acceptance"): MEDIA,
    ("POST", "/detokenize", "positive_data_acceptance"): "token ids past the model's vocabulary",
    ("POST", "/pooling", "positive_data_acceptance"):
        "`data` is a GeoTIFF as base64, a URL or a file name: whether it decodes, answers or exists",
    ("POST", "/v1/pool", "positive_data_acceptance"):
        "any bytes are a valid binary string: whether they are a GeoTIFF of the model's bands; and `?date=` "
        "must be a real day (2024-02-30 is none)",
    ("POST", "/v1/scenes", "positive_data_acceptance"):
        "a GeoTIFF body as /v1/pool's; `?date=` goes with a GeoTIFF body only, a rule across the query and the "
        "body's media type that OpenAPI cannot state",
    ("GET", "/v1/scenes/{id}/tiles/{layer}/{z}/{x}/{y}.png", "positive_data_acceptance"):
        "x and y must be below 2 ** z, a bound one path parameter sets on another, which OpenAPI cannot state",
}


def fuzz_config(path, document: dict) -> str:
    """A schemathesis.toml: every check on, but each of `CANNOT_JUDGE`'s for its operation (of those in the
    server's `document`). Not `--checks all`: the command line's choice would override the operations'."""
    lines = ["[checks]", "enabled = true", ""]
    for (method, route, check), why in CANNOT_JUDGE.items():
        if method.lower() in document["paths"].get(route, {}):
            lines += ["[[operations]]", f"# {why}", f"include-name = {json.dumps(f'{method} {route}')}",
                      f"checks.{check}.enabled = false", ""]
    path.write_text("\n".join(lines))
    return str(path)


def run_schemathesis(base: str, tmp_path, headers: dict) -> dict:
    """`st run` against the server's document; its JSON report."""
    report = tmp_path / "report.json"
    document = httpx.get(f"{base}/openapi.json", timeout=10).json()
    command = [sys.executable, "-m", "schemathesis.cli", "--config-file",
               fuzz_config(tmp_path / "schemathesis.toml", document),
               "run", f"{base}/openapi.json", "--mode", "all", "--max-examples", str(EXAMPLES),
               "--generation-deterministic", "--no-shrink", "--continue-on-failure", "--workers", "1",
               "--request-timeout", "60", "--max-response-time", "60", "--no-color",
               "--report", "json", "--report-json-path", str(report)]
    for name, value in headers.items():
        command += ["--header", f"{name}: {value}"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "SCHEMATHESIS_HOOKS": "tests.reliability.fuzz_hooks"}
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert report.is_file(), run.stdout + run.stderr
    result = json.loads(report.read_text())
    assert result["complete"] and not result["failures"] and not result["errors"], _failures(run.stdout)
    assert run.returncode == 0, run.stdout[-4000:]
    return result


def _failures(output: str) -> str:
    """The run's failures and summary, without the long answers (a /metrics page) in between."""
    start = output.find("FAILURES")
    kept = [line for line in output[start:].splitlines() if not line.startswith("    appliance_")]
    return "\n".join(kept)[-20000:]


def assert_every_operation_and_phase_ran(result: dict, operations: int, phases: dict) -> None:
    assert result["operations"] == {"total": operations, "selected": operations, "tested": operations,
                                    "errored": 0, "skipped": 0, "skip_reasons": []}
    assert {phase: state["status"] for phase, state in result["phases"].items()} == phases


def test_the_generate_server_holds_its_whole_document(llava_server, tmp_path):
    result = run_schemathesis(llava_server.base, tmp_path, {})
    # no examples in its document; its stateful phase follows /v1/models to /v1/models/{model_id}
    assert_every_operation_and_phase_ran(result, 11, {"examples": "skip", "coverage": "success",
                                                      "fuzzing": "success", "stateful": "success"})
    assert result["test_cases"]["generated"] >= 500


def test_the_pooling_server_holds_its_whole_document(flood_server, tmp_path):
    result = run_schemathesis(flood_server.base, tmp_path, {"Authorization": f"Bearer {API_KEY}"})
    # stateful: a scene created, listed, read, its files and map tiles fetched, deleted, read again
    # (use_after_free)
    assert_every_operation_and_phase_ran(result, 15, {"examples": "success", "coverage": "success",
                                                      "fuzzing": "success", "stateful": "success"})
    assert result["test_cases"]["generated"] >= 300
    pool = result["valid_rates"]["POST /v1/pool"]
    assert sum(phase["accepted"] for phase in pool.values()) >= 1  # a real scene got through


def test_every_check_runs_but_those_it_cannot_judge(tmp_path):
    """The config turns every check of schemathesis on, and off only `CANNOT_JUDGE`'s, each for an operation
    the route table has."""
    from schemathesis.checks import CHECKS, load_all_checks
    from schemathesis.config import SchemathesisConfig

    from appliance.serving.http.route_table import ROUTES

    operations = {(method, route.openapi_path) for route in ROUTES if route.documented for method in route.methods}
    assert {(method, path) for method, path, _ in CANNOT_JUDGE} <= operations
    document: dict = {"paths": {}}
    for method, path in operations:
        document["paths"].setdefault(path, {})[method.lower()] = {}
    config = SchemathesisConfig.from_path(fuzz_config(tmp_path / "schemathesis.toml", document))
    project = config.projects.get_default()
    load_all_checks()
    names = CHECKS.get_all_names()
    assert len(names) >= 14 and all(project.checks.get_by_name(name=name).enabled for name in names)
    configured = project.operations.operations
    assert len(configured) == len(CANNOT_JUDGE)
    for (method, path, check), operation in zip(CANNOT_JUDGE, configured):
        assert not operation.checks.get_by_name(name=check).enabled, (method, path)
