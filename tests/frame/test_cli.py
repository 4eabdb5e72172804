"""The CLI verbs, run as subprocesses the way a user runs them."""
from pathlib import Path

import pytest
import yaml

from appliance.cli import main

from tests.conftest import FRAME_CONF, assert_user_error, run_cli


def test_config_prints_composed_yaml_for_both_pipelines():
    for pipeline, architecture in [("llava_chat", "LlavaForConditionalGeneration"), ("prithvi_flood", "Prithvi")]:
        result = run_cli("config", f"pipeline={pipeline}", "engine.max_num_seqs=7")
        assert result.returncode == 0, result.stderr
        cfg = yaml.safe_load(result.stdout)
        assert cfg["pipeline"]["name"] == pipeline
        assert cfg["model"]["architecture"].startswith(architecture)
        assert cfg["engine"]["max_num_seqs"] == 7


def test_run_check_and_config_with_test_stages(tmp_path):
    numbers = tmp_path / "numbers.txt"
    numbers.write_text("1\n2\n3.5\n")
    # A relative input resolves against the caller's directory: Hydra must not chdir.
    result = run_cli("run", "input=numbers.txt", "pipeline.stages.scale.factor=10", conf_dir=FRAME_CONF, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "total 65"
    result = run_cli("check", conf_dir=FRAME_CONF, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "read_numbers -> scale -> total" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["numbers.txt"], "no outputs/ or .hydra/ written"


def test_check_rejects_a_stage_whose_input_nobody_produces():
    assert_user_error(run_cli("check", "pipeline=orphan", conf_dir=FRAME_CONF), "needs_pixels", "'pixels'")


def test_bad_inputs_end_with_one_line_and_exit_2(tmp_path):
    cases = [
        (["config", "engine.nope=1"], ["engine.nope", "allowed:"]),
        (["config", "+model.foo=1"], ["model.foo", "unknown key"]),
        (["config", "engine.tensor_parallel_size=two"], ["engine.tensor_parallel_size"]),
        (["check", "pipeline=nope"], ["pipeline=nope", "llava_chat"]),
        (["run", "model=nope"], ["model=nope"]),
        (["run", "pipeline.stages.scale.stage=nope"], ["unknown stage 'nope'"]),
        (["run", f"input={tmp_path / 'missing.txt'}"], ["input:", "missing.txt"]),
    ]
    for args, fragments in cases:
        conf = None if args[1].startswith(("engine", "+model", "pipeline=nope", "model=nope")) else FRAME_CONF
        assert_user_error(run_cli(*args, conf_dir=conf), *fragments)


def test_check_names_a_missing_model_path(tmp_path):
    result = run_cli("check", "pipeline=llava_chat", f"model.path={tmp_path / 'nowhere'}")
    assert_user_error(result, "model.path", "nowhere")
    result = run_cli("check", "pipeline=llava_chat", "model=llava_1_5_7b")
    assert_user_error(result, "model.path")


def test_usage_errors_exit_2():
    result = run_cli("explode")
    assert result.returncode == 2 and "invalid choice" in result.stderr
    assert run_cli("--help").returncode == 0



def test_stage_options_are_checked_by_the_verbs():
    for verb in ("config", "check"):
        assert_user_error(run_cli(verb, "pipeline=prithvi_flood", "pipeline.stages.tile.overlapp=64"),
                          "pipeline.stages.tile.overlapp", "stage 'tile'", "allowed: tile_size, stride, overlap")
    result = run_cli("config", "pipeline=prithvi_flood", "pipeline.stages.tile.overlap=64",
                     "pipeline.stages.raster_write.quicklook=true")
    assert result.returncode == 0, result.stderr
    stages = yaml.safe_load(result.stdout)["pipeline"]["stages"]
    assert stages["tile"]["overlap"] == 64 and stages["raster_write"]["quicklook"] is True
    assert list(stages) == ["raster_inputs", "raster_read", "tile", "normalize", "engine", "stitch", "raster_write",
                            "region"]


@pytest.mark.parametrize("verb, fragments", [
    ("run", ["llava_chat", "prithvi_flood", "input=PATH", "output=PATH", "prompt=TEXT", "overwrite=true",
             "<name>.mask.tif", "appliance run pipeline=prithvi_flood input=scene.tif output=mask.tif",
             "aoi=[XMIN,YMIN,XMAX,YMAX]", "lon/lat degrees unless aoi_crs", "aoi_crs=CRS", "prompt_file=PATH",
             "system=TEXT"]),
    ("check", ["examples:", "appliance check pipeline=prithvi_flood input=scene.tif output=mask.tif",
               "the server.* settings", "as its stages read them", "URLs are left to the run"]),
    ("config", ["examples:", "appliance config pipeline=llava_chat"]),
    ("serve", ["llava_chat", "prithvi_flood", "http://127.0.0.1:8000", "/v1/chat/completions", "/pooling",
               "/health", "appliance serve pipeline=llava_chat"]),
])
def test_help_lists_pipelines_keys_and_examples(capsys, verb, fragments):
    with pytest.raises(SystemExit) as done:
        main([verb, "--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    for fragment in fragments:
        assert fragment in shown, fragment


def test_every_key_of_a_run_is_in_run_help(capsys):
    """Each key a shipped pipeline takes from the command line is documented in `run --help`."""
    from appliance.config.compose import compose, group_options

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    shown = capsys.readouterr().out
    for pipeline in group_options("pipeline"):
        for key in compose([f"pipeline={pipeline}"]).pipeline.inputs:
            assert f"  {key}=" in shown, (pipeline, key)


def test_every_search_key_is_in_run_help(capsys):
    from dataclasses import fields

    from appliance.config.schema import SearchConfig

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    shown = capsys.readouterr().out
    for key in fields(SearchConfig):
        assert f"  search.{key.name}=" in shown, key.name


def test_help_describes_each_pipeline_in_a_whole_sentence(capsys):
    """The first line of each pipeline file's header is what `--help` shows: it must not stop mid-sentence."""
    from appliance.config.compose import group_options

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    shown = capsys.readouterr().out.splitlines()
    for pipeline in group_options("pipeline"):
        line = next(line for line in shown if line.startswith(f"  {pipeline} "))
        assert line.endswith("."), line


def test_version_prints_the_package_version(capsys):
    from appliance import __version__

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"appliance {__version__}"


def _user_error(capsys, argv, *fragments):
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"appliance {argv[0]}: error: "), lines
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


SAMPLES = Path(__file__).resolve().parents[2] / "appliance" / "assets" / "samples"


def test_check_verifies_the_local_inputs_a_run_names(capsys, tmp_path):
    flood = SAMPLES / "flood_sample.tif"
    _user_error(capsys, ["check", "pipeline=prithvi_flood", "input=missing.tif"], "missing.tif: no such file")
    _user_error(capsys, ["check", "pipeline=prithvi_flood", f"input=[{flood},gone.tif]", f"output={tmp_path}"],
                "gone.tif: no such file")
    _user_error(capsys, ["check", "pipeline=prithvi_flood", f"input={tmp_path}"], "is not a file; expected a GeoTIFF")
    _user_error(capsys, ["check", "pipeline=llava_chat", "prompt_file=q (1).txt"], "prompt_file: cannot read q (1).txt")
    scenes = f"input=[{flood},https://x.test/b.tif]"  # a URL is the run's to fetch
    assert main(["check", "pipeline=prithvi_flood", scenes, f"output={tmp_path}"]) == 0
    assert capsys.readouterr().out.startswith("ok: pipeline prithvi_flood")
    assert main(["check", "pipeline=llava_chat"]) == 0, "no run's inputs: a config to serve"
    assert capsys.readouterr().out.startswith("ok: pipeline llava_chat")


def test_a_pipeline_the_server_cannot_feed_is_called_offline_only(capsys):
    _user_error(capsys, ["serve", "pipeline=llava_encode"],
                "pipeline llava_encode is offline only: use `appliance run`")
