import logging
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytest_plugins = ["tests.servers"]  # the shared `appliance serve` fixtures
FRAME_CONF = REPO / "tests" / "frame" / "conf"

# The slow tier: `make test` runs everything; `make test-fast` (`pytest -m "not slow"`) leaves these out and
# still reaches every package (README). Each is a file or one test, by node id; most start processes (the
# CLI, a server, TP ranks) or run a model end to end. `@pytest.mark.slow` on a test works too.
SLOW = (
    "tests/chat/test_cli_e2e.py",  # `appliance run` on chat pipelines, a process a case
    "tests/geo/test_cli_e2e.py",  # the same for flood masks
    "tests/geo/test_stac_search.py",  # a real STAC API (PostgreSQL, pgstac) started once, `appliance` processes
    # eight `appliance` processes over the 27 items of that API; a process a case
    "tests/geo/test_region_shares.py::test_shares_map_every_item_once_and_assemble_gives_the_single_runs_region",
    "tests/geo/test_region_shares.py::test_bad_share_settings_are_refused_before_the_run",
    "tests/chat/test_encode.py::test_features_from_llava_encode_give_the_same_answers_as_pixels",
    "tests/chat/test_encode.py::test_llava_encode_refuses_bad_input_before_writing",
    "tests/frame/test_cli.py::test_config_prints_composed_yaml_for_both_pipelines",
    "tests/frame/test_cli.py::test_run_check_and_config_with_test_stages",
    "tests/frame/test_cli.py::test_bad_inputs_end_with_one_line_and_exit_2",
    "tests/frame/test_cli.py::test_check_names_a_missing_model_path",
    "tests/frame/test_cli.py::test_stage_options_are_checked_by_the_verbs",
    # two processes a case
    "tests/frame/test_check_matches_run.py::test_check_refuses_a_server_or_engine_setting_as_serve_does",
    "tests/frame/test_serve.py::test_serve_runs_the_pipeline_and_rejects_bad_requests",
    "tests/frame/test_serve.py::test_a_dead_engine_takes_the_server_down_with_exit_code_1",
    "tests/frame/test_serve.py::test_start_up_lines_are_info_and_one_says_ready_with_the_url",
    "tests/serving/test_lifecycle.py",  # one server with limits, drained at the end
    "tests/serving/test_pooling.py::test_a_client_that_leaves_stops_the_remaining_tiles",
    "tests/serving/test_metrics.py",
    "tests/serving/test_stream_interval.py",  # a server of its own
    "tests/serving/test_auto_tool_choice.py",  # a server of its own (the tool-calling tiny LLaVA)
    "tests/serving/test_scenes.py",  # a server of its own (max_kept=1), scenes run to the end
    "tests/geo/test_served_tl.py",  # a server of its own with the tiny TL model
    "tests/engine/test_tensor_parallel.py::test_tp2_matches_tp1",  # TP ranks are processes
    "tests/engine/test_tensor_parallel.py::test_tp2_structured_output_matches_tp1",
    "tests/engine/test_tensor_parallel.py::test_killed_worker_raises_clear_error",
    "tests/engine/test_tensor_parallel.py::test_hung_worker_times_out",
    "tests/engine/test_tensor_parallel.py::test_indivisible_tp_size_is_a_clear_error",
    "tests/engine/test_tensor_parallel.py::test_worker_that_raises_mid_run_reaches_rank_0",
    "tests/engine/test_llava.py::test_tp2_matches_tp1",
    "tests/engine/test_int4.py::test_two_ranks_quantise_their_shards_and_answer_as_one",
    "tests/engine/test_cpu_kernels.py::test_fresh_cache_builds_once",  # compiles the kernels
    "tests/engine/test_engine_sizing.py::test_cli_refusal_is_one_line_exit_2",
    "tests/chat/test_bf16.py",  # `appliance run` in fp32 and bf16
    "tests/geo/test_bf16.py",
    # reliability: a server (or CLI) process a case, loaded, faulted or fuzzed; the hostile-input cases
    # share one server each and stay in the fast tier
    "tests/reliability/test_load.py",
    "tests/reliability/test_engine_faults.py",
    "tests/reliability/test_geo_faults.py",
    "tests/reliability/test_fuzz.py",
    "tests/ui/test_chat_key_and_stop.py",  # two servers of its own
    "tests/ui/test_map_full_resolution.py",  # a 3660 x 3660 scene through the flood model (81 tiles)
    "tests/ui/test_page_routes.py::test_server_ui_false_answers_404_at_the_root_and_keeps_the_docs",
)


def pytest_addoption(parser):
    parser.addoption("--docs-screenshots", action="store_true",
                     help="write the browser tests' screenshots over docs/page-*.png (make screenshots)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(item.nodeid == slow or item.nodeid.startswith((slow + "::", slow + "[")) for slow in SLOW):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def root_logging_as_found():
    """A test that runs the CLI in this process (`appliance.cli.main`) sets the root logger up on that test's
    captured stderr, which pytest closes after it; later tests would then log into a closed stream
    ("--- Logging error ---"). Every test leaves the root logger's handlers and level as it found them."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@contextmanager
def one_torch_thread():
    """torch on one thread, then back: 2 OpenMP threads on 2 shared cores stall each other on tiny ops."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def run_cli(*args, conf_dir=None, cwd=None, timeout=300, env=None):
    """Run `python -m appliance.cli ARGS` as a user would; returns the CompletedProcess."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))  # keep carried packages
    full_env = {**os.environ, "PYTHONPATH": path, **(env or {})}
    full_env.pop("APPLIANCE_CONF_DIR", None)
    if conf_dir is not None:
        full_env["APPLIANCE_CONF_DIR"] = str(conf_dir)
    return subprocess.run(
        [sys.executable, "-m", "appliance.cli", *map(str, args)],
        capture_output=True, text=True, cwd=cwd or REPO, env=full_env, timeout=timeout,
    )


def assert_user_error(result, *fragments):
    """Exit 2, exactly one line on stderr naming every fragment, and no traceback."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def assert_config_error(overrides, *fragments):
    """Composing `overrides` fails with one ConfigError line naming every fragment."""
    from appliance.config.compose import compose
    from appliance.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        compose(overrides)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


@pytest.fixture
def frame_conf(monkeypatch):
    monkeypatch.setenv("APPLIANCE_CONF_DIR", str(FRAME_CONF))
    return FRAME_CONF


# Prithvi's architecture at toy size, for tests that exercise the pipeline rather than the model.
TINY_PRITHVI = ["model.prithvi.embed_dim=32", "model.prithvi.depth=2", "model.prithvi.num_heads=2",
                "model.prithvi.selected_indices=[0,1,1,1]", "model.prithvi.decoder_channels=16",
                "model.prithvi.coords_encoding=[]", "model.prithvi.coords_scale_learn=false"]


@pytest.fixture(scope="session")
def tiny_prithvi_checkpoint(tmp_path_factory):
    """Random weights of TINY_PRITHVI saved as our safetensors checkpoint."""
    import torch

    from appliance.config.compose import compose
    from appliance.engine.models.prithvi import build_prithvi_segmentation, save_safetensors

    cfg = compose(["pipeline=prithvi_flood", *TINY_PRITHVI])
    torch.manual_seed(0)
    model = build_prithvi_segmentation(cfg.model.prithvi, in_chans=len(cfg.model.geo.bands))
    path = tmp_path_factory.mktemp("prithvi") / "tiny.safetensors"
    save_safetensors(model, path)
    return path
