"""`appliance check` gives `run`'s verdict on bad inputs (and `serve`'s on bad server settings): the same
exit code 2 and the same one line, found before either reads the model's files (`Pipeline.check`)."""
import signal

import numpy as np
import pytest
import rasterio
from rasterio.transform import from_origin

from appliance.cli import main
from appliance.pipeline import Pipeline

from tests.conftest import REPO, assert_user_error, run_cli

SAMPLES = REPO / "appliance" / "assets" / "samples"
FLOOD = SAMPLES / "flood_sample.tif"
STAR = SAMPLES / "orange_star.png"


def _two_band_tif(path):
    profile = dict(driver="GTiff", width=8, height=8, count=2, dtype="uint16", crs="EPSG:4326",
                   transform=from_origin(-93.0, 30.0, 0.001, 0.001))
    with rasterio.open(path, "w", **profile) as ds:
        ds.write(np.ones((2, 8, 8), dtype="uint16"))


# (case, argv after the verb ({tmp}: the test's directory), a fragment of the error line)
CASES = [
    ("png_for_flood", ["pipeline=prithvi_flood", f"input={STAR}", "output={tmp}/mask.tif"], "not a GeoTIFF"),
    ("text_named_tif", ["pipeline=prithvi_flood", "input={tmp}/fake.tif", "output={tmp}/mask.tif"],
     "cannot be read as a GeoTIFF"),
    ("two_bands_for_six", ["pipeline=prithvi_flood", "input={tmp}/two_bands.tif", "output={tmp}/mask.tif"],
     "has 2 bands but the model expects 6"),
    ("one_date_for_three", ["pipeline=prithvi_crops", f"input={FLOOD}", "output={tmp}/crops.tif"],
     "holds 3 dates x 6 bands"),
    ("aoi_outside_scene", ["pipeline=prithvi_flood", f"input={FLOOD}", "output={tmp}/mask.tif", "aoi=[0,0,1,1]"],
     "does not overlap"),
    ("bad_date", ["pipeline=prithvi_flood", f"input={FLOOD}", "output={tmp}/mask.tif", "date=2020-13-45"],
     "date: '2020-13-45' is not a date"),
    ("mask_inside_package", ["pipeline=prithvi_flood", f"input={FLOOD}"], "inside the appliance package"),
    ("output_exists", ["pipeline=prithvi_flood", f"input={FLOOD}", "output={tmp}/fake.tif"],
     "exists; pass overwrite=true"),
    ("no_prompt", ["pipeline=llava_chat", f"input={STAR}"], "prompt: required with an image input"),
    ("missing_prompt_file", ["pipeline=llava_chat", f"input={STAR}", "prompt_file={tmp}/gone.txt"],
     "prompt_file: cannot read"),
    ("empty_prompt_file", ["pipeline=llava_chat", f"input={STAR}", "prompt_file={tmp}/empty.txt"],
     "the question is empty"),
    ("latin1_prompt_file", ["pipeline=llava_chat", f"input={STAR}", "prompt_file={tmp}/latin1.txt"],
     "is not UTF-8 text"),
    ("bad_jsonl_line", ["pipeline=llava_chat", "input={tmp}/requests.jsonl", "output={tmp}/answers.jsonl"],
     "line 2: not valid JSON"),
    ("jsonl_without_output", ["pipeline=llava_chat", "input={tmp}/requests.jsonl"], "output: required"),
    # A single prompt's image is named as the person set it, not as the request it became.
    ("unreadable_image", ["pipeline=llava_chat", "input={tmp}/broken.png", "prompt=What is it?"],
     "error: input={tmp}/broken.png: not an image Pillow can read"),
    ("unreadable_image_after_system", ["pipeline=llava_chat", "input={tmp}/broken.png", "prompt=What?",
                                       "system=Be brief."], "error: input={tmp}/broken.png: not an image"),
    ("bad_image_in_jsonl", ["pipeline=llava_chat", "input={tmp}/images.jsonl", "output={tmp}/answers.jsonl"],
     "images.jsonl line 1 (custom_id 'x'): messages[0].content[0].image_url: not an image Pillow can read"),
    ("image_over_pixel_cap", ["pipeline=llava_chat", f"input={STAR}", "prompt=What?",
                              "server.limits.max_image_pixels=100"], "the limit is 100 pixels"),
    ("unreadable_image_to_encode", ["pipeline=llava_encode", "input={tmp}/broken.png",
                                    "output={tmp}/f.safetensors"], "input: not an image Pillow can read"),
]


@pytest.fixture
def inputs(tmp_path):
    """The corpus's bad files, in `tmp_path`."""
    (tmp_path / "fake.tif").write_text("not a GeoTIFF\n")
    _two_band_tif(tmp_path / "two_bands.tif")
    (tmp_path / "empty.txt").write_text(" \n")
    (tmp_path / "latin1.txt").write_bytes("Qu'y a-t-il là ?".encode("latin-1"))
    (tmp_path / "broken.png").write_bytes(b"\x89PNG but not really")
    (tmp_path / "requests.jsonl").write_text(
        '{"custom_id": "a", "body": {"messages": [{"role": "user", "content": "hi"}]}}\n{"custom_id": \n')
    (tmp_path / "images.jsonl").write_text(
        '{"custom_id": "x", "body": {"messages": [{"role": "user", "content": [{"type": "image_url", '
        '"image_url": {"url": "broken.png"}}, {"type": "text", "text": "What?"}]}]}}\n')
    return tmp_path


@pytest.fixture
def no_model_files(monkeypatch):
    """Both verbs must refuse before they read the model's files (`Pipeline.check`), let alone its weights;
    `run` sets its own Ctrl-C and SIGTERM handlers, put back afterwards."""
    def reached(self):
        raise AssertionError("the bad input was not found before the model's files were read")

    monkeypatch.setattr(Pipeline, "check", reached)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in handlers.items():
        signal.signal(signum, handler)


def _verdict(capsys, verb, argv):
    code = main([verb, *argv])
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    prefix = f"appliance {verb}: error: "
    assert lines[0].startswith(prefix), lines[0]
    return code, lines[0][len(prefix):]


@pytest.mark.parametrize("argv, fragment", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_check_refuses_what_run_refuses_with_the_same_line(capsys, inputs, no_model_files, argv, fragment):
    argv = [arg.format(tmp=inputs) for arg in argv]
    checked = _verdict(capsys, "check", argv)
    assert checked == _verdict(capsys, "run", argv)
    assert checked[0] == 2 and fragment.format(tmp=inputs) in f"error: {checked[1]}", checked


def test_remote_inputs_are_left_to_the_run(capsys, inputs, no_model_files):
    """A URL is the run's to fetch: the preflight reads the local scene beside it, and no network."""
    argv = ["pipeline=prithvi_flood", f"input=[{inputs / 'fake.tif'},https://x.test/b.tif]", f"output={inputs}"]
    assert _verdict(capsys, "check", argv) == (2, f"{inputs / 'fake.tif'}: cannot be read as a GeoTIFF ('"
                                                  f"{inputs / 'fake.tif'}' not recognized as being in a supported "
                                                  "file format.); expected a .tif scene")


@pytest.mark.parametrize("setting, fragment", [
    ("server.stats_interval_s=-1", "server.stats_interval_s: -1; allowed: 0"),
    ("server.stream_interval=0", "server.stream_interval: 0; allowed: 1 or more"),
    ("server.cors_origins=[https://app.example/]", "server.cors_origins: 'https://app.example/'; allowed: an origin"),
    ("engine.device=gpu", "engine.device: 'gpu'; allowed: cpu, cuda or cuda:N"),
])
def test_check_refuses_a_server_or_engine_setting_as_serve_does(setting, fragment, tmp_path):
    argv = ["pipeline=llava_chat", setting]
    checked, served = run_cli("check", *argv, timeout=120), run_cli("serve", *argv, timeout=120)
    assert_user_error(checked, fragment)
    assert_user_error(served, fragment)
    assert checked.stderr.replace("appliance check:", "appliance serve:") == served.stderr


def test_check_refuses_a_model_that_cannot_fit_as_run_and_serve_do(capsys, tmp_path):
    """Memory fit is the engine's own rule on the model's files (engine/model_fit.py), asked before any weight
    loads: a 1 MB budget leaves less than the runtime reserve for either model."""
    budget = "engine.memory_budget_bytes=1000000"
    flood = ["pipeline=prithvi_flood", f"input={FLOOD}", f"output={tmp_path}/mask.tif", budget]
    checked = _verdict(capsys, "check", flood)
    assert checked == _verdict(capsys, "run", flood)
    assert checked[0] == 2 and "prithvi_demo_flood/model.safetensors does not fit" in checked[1], checked
    assert not (tmp_path / "mask.tif").exists()
    chat = ["pipeline=llava_chat", budget]
    checked_chat, served = run_cli("check", *chat, timeout=120), run_cli("serve", *chat, timeout=120)
    assert_user_error(checked_chat, "llava_tiny does not fit")
    assert checked_chat.stderr.replace("appliance check:", "appliance serve:") == served.stderr


def test_check_leaves_a_missing_output_directory_to_the_run(capsys, tmp_path):
    """`check` proves the output can be written without writing: the run makes the directory with its file."""
    argv = ["pipeline=prithvi_flood", f"input={FLOOD}", f"output={tmp_path}/maps/2024/mask.tif"]
    assert main(["check", *argv]) == 0
    assert list(tmp_path.iterdir()) == []
    assert main(["run", *argv]) == 0
    assert (tmp_path / "maps" / "2024" / "mask.tif").is_file()
