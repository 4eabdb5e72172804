"""`appliance run pipeline=prithvi_flood` as a user runs it: a subprocess, a real (tiny, random) Prithvi.

Good runs write a GeoTIFF on the input's grid; bad inputs exit 2 with one stderr line naming the
file or field, no traceback, and leave no mask or temp file behind.
"""
import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import tempfile
import termios
from pathlib import Path

import numpy as np
import pytest
import rasterio

from tests.conftest import TINY_PRITHVI as TINY
from tests.conftest import REPO, assert_user_error, run_cli
from tests.geo.conftest import synthetic, write_raster

@pytest.fixture
def checkpoint(tiny_prithvi_checkpoint):
    return tiny_prithvi_checkpoint


@pytest.fixture
def dirs(tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    return src, out


def flood(checkpoint, input, output, *extra):
    """`appliance run pipeline=prithvi_flood` with the tiny model and 64-pixel tiles."""
    if isinstance(input, (list, tuple)):
        input = "[" + ",".join(map(str, input)) + "]"
    return run_cli("run", "pipeline=prithvi_flood", f"input={input}", f"output={output}",
                   f"model.checkpoint={checkpoint}", *TINY, "pipeline.stages.tile.tile_size=64", *extra, timeout=120,
                   env={"OMP_NUM_THREADS": "1"})  # one thread: faster on cores that others share


def listing(*directories):
    return [sorted(p.name for p in d.iterdir()) for d in directories]


def assert_mask_matches(mask_path, scene_path):
    """The mask is on the scene's grid, uint8, 255 exactly where the scene has nodata, else 0/1."""
    with rasterio.open(scene_path) as src, rasterio.open(mask_path) as dst:
        assert (dst.width, dst.height, dst.count) == (src.width, src.height, 1)
        assert dst.crs == src.crs and dst.transform == src.transform
        assert dst.dtypes == ("uint8",) and dst.nodata == 255
        nodata = (src.read() == src.nodata).any(axis=0)
        mask = dst.read(1)
    assert np.array_equal(mask == 255, nodata)
    assert set(np.unique(mask[~nodata])) <= {0, 1}
    return mask


def test_run_writes_mask_on_the_input_grid(checkpoint, dirs):
    src, out = dirs
    scene = synthetic.write_scene(src / "a.tif", 100, 130, seed=1)
    (out / "mask.tif").write_bytes(b"old")  # replaced: overwrite=true
    result = flood(checkpoint, scene, out / "mask.tif", "overwrite=true")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [result.stdout.strip()]
    assert result.stdout.startswith(f"wrote {out / 'mask.tif'}: 130x100, 6 tiles, water ")
    assert "Traceback" not in result.stderr
    mask = assert_mask_matches(out / "mask.tif", scene)
    assert (mask == 255).any(), "the synthetic scene has nodata patches"
    assert listing(src, out) == [["a.tif"], ["mask.stac.json", "mask.tif"]]


@pytest.mark.filterwarnings("ignore::rasterio.errors.NotGeoreferencedWarning")  # reading nocrs.tif here
def test_several_inputs_into_a_directory_including_all_nodata_and_no_crs(checkpoint, dirs):
    """One run, three scenes: a normal one, one that is all nodata (all 255), one without a CRS (a warning);
    the region's files follow, its mosaic without the mask that has no place on a map."""
    src, out = dirs
    a = synthetic.write_scene(src / "a.tif", 70, 90, seed=1)
    empty = write_raster(src / "empty.tif", np.full((6, 40, 50), -9999, np.int16), nodata=-9999,
                         descriptions=synthetic.BANDS)
    dn, _ = synthetic.make_scene(40, 70, seed=4)
    nocrs = write_raster(src / "nocrs.tif", dn, crs=None, nodata=synthetic.NODATA_DN,
                         descriptions=synthetic.BANDS)
    result = flood(checkpoint, [a, empty, nocrs], out / "masks")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("wrote ")]
    assert len(lines) == 3, result.stdout
    assert "a.mask.tif: 90x70, 4 tiles" in lines[0]
    assert "empty.mask.tif: 50x40, 1 tile, water n/a, nodata 100.0%" in lines[1]
    assert "nocrs.mask.tif: 70x40, 2 tiles" in lines[2]
    assert "nocrs.tif has no CRS" in result.stderr and "Traceback" not in result.stderr
    assert "region: 1 of 3 masks have no CRS and are left out of the mosaic" in result.stderr
    assert "region: mosaic " in result.stdout and "(2 masks, overlaps: latest)" in result.stdout
    masks = [f"{name}.mask.{kind}" for name in ("a", "empty", "nocrs") for kind in ("stac.json", "tif")]
    assert listing(out / "masks") == [sorted([*masks, "collection.json", "mosaic.tif", "summary.json"])]
    assert_mask_matches(out / "masks" / "a.mask.tif", a)
    assert_mask_matches(out / "masks" / "nocrs.mask.tif", nocrs)
    with rasterio.open(out / "masks" / "empty.mask.tif") as dst:
        assert (dst.read(1) == 255).all() and (dst.width, dst.height) == (50, 40)


def make_bad(kind, src, out):
    """(input, output, extra overrides) for a bad run of `kind`."""
    scene = src / "scene.tif"
    if kind == "not_tiff":
        scene.write_text("this is not a raster\n")
    elif kind == "truncated":
        synthetic.write_scene(scene, 300, 400, seed=1)
        scene.write_bytes(scene.read_bytes()[: scene.stat().st_size // 2])
        # It fails mid-scene: on a slow host a progress line may come first; this test is about the error.
        return scene, out / "m.tif", ["pipeline.stages.stitch.progress=false"]
    elif kind == "four_bands":
        write_raster(scene, np.ones((4, 20, 20), np.int16), descriptions=synthetic.BANDS[:4])
    else:
        synthetic.write_scene(scene, 30, 30, seed=1)
    if kind == "output_is_input":
        return scene, scene, ["overwrite=true"]
    if kind == "output_exists":
        (out / "m.tif").write_bytes(b"old")
    if kind == "missing_checkpoint":
        return scene, out / "m.tif", ["model.checkpoint=/nope.pt"]
    return scene, out / "m.tif", []


@pytest.mark.parametrize("kind, fragments", [
    ("not_tiff", ["scene.tif: cannot be read as a GeoTIFF"]),
    ("truncated", ["scene.tif: is truncated or corrupt"]),
    ("four_bands", ["scene.tif", "has 4 bands but the model expects 6"]),
    ("output_is_input", ["output:", "scene.tif is an input scene"]),
    ("output_exists", ["m.tif exists; pass overwrite=true"]),
    ("missing_checkpoint", ["model.checkpoint: /nope.pt is not a file"]),
])
def test_bad_input_is_one_line_and_leaves_nothing(checkpoint, dirs, kind, fragments):
    src, out = dirs
    scene, output, extra = make_bad(kind, src, out)
    before = listing(src, out)
    result = flood(checkpoint, scene, output, *extra)
    assert_user_error(result, *fragments)
    assert result.stdout == ""
    assert listing(src, out) == before
    if kind == "output_exists":
        assert (out / "m.tif").read_bytes() == b"old"


def can_create_file_in(directory):
    try:
        with tempfile.NamedTemporaryFile(dir=directory):
            return True
    except OSError:
        return False


def test_unwritable_output_directory(checkpoint, dirs):
    src, out = dirs
    scene = synthetic.write_scene(src / "s.tif", 30, 30, seed=1)
    out.chmod(0o500)
    try:
        target = out
        if can_create_file_in(out):  # root ignores the mode; sysfs refuses new files even to root
            target = Path("/sys")
            if not target.is_dir() or can_create_file_in(target):
                pytest.skip("no directory this user cannot write to")
        result = flood(checkpoint, scene, target / "m.tif")
        assert_user_error(result, f"cannot write to directory {target}")
        assert result.stdout == ""
        assert listing(src, out) == [["s.tif"], []]
    finally:
        out.chmod(0o700)


def test_a_lat_lon_swapped_aoi_is_one_line_whose_hint_runs(checkpoint, dirs):
    """The box as a user types it with lat first: exit 2, one line naming `aoi`, no traceback; the form
    the line suggests then runs."""
    src, out = dirs
    scene = synthetic.write_scene(src / "a.tif", 100, 130, seed=1)  # UTM 15N, about lon -93, lat 29.8
    swapped = flood(checkpoint, scene, out / "m.tif", "aoi=[29.81,-92.99,29.82,-92.98]")
    assert_user_error(swapped, "aoi: [29.81,-92.99,29.82,-92.98] is outside lon/lat's range",
                      "did you mean aoi=[-92.99,29.81,-92.98,29.82]")
    assert swapped.stdout == "" and listing(out) == [[]]
    hinted = swapped.stderr.split("did you mean ")[1].split(" ")[0]
    result = flood(checkpoint, scene, out / "m.tif", hinted)
    assert result.returncode == 0, result.stderr
    with rasterio.open(out / "m.tif") as ds:
        assert 0 < ds.width < 130 and 0 < ds.height < 100  # the box's window, not the scene


SAMPLE = REPO / "appliance" / "assets" / "samples" / "flood_sample.tif"
PROGRESS_LINE = r"flood_sample\.tif: (\d+)/12 tiles \(\d+%\), \d+\.\d tiles/s, (eta \S+|in \d+\S*)"
SAMPLE_TILES = ["pipeline.stages.tile.tile_size=128"]  # 400x300 in 12 tiles, stride 112


def test_progress_without_a_terminal_ends_at_n_of_n(tmp_path):
    """stderr a pipe (a Kubernetes Job's log): plain progress lines, the last at 12/12 (100 %); stdout
    holds the result alone. (tests/geo/test_chain.py: that last line is out before the result is.)"""
    out = tmp_path / "mask.tif"
    result = run_cli("run", "pipeline=prithvi_flood", f"input={SAMPLE}", f"output={out}", *SAMPLE_TILES,
                     env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [result.stdout.strip()] and result.stdout.startswith(f"wrote {out}: ")
    lines = result.stderr.splitlines()
    assert lines and all(re.fullmatch(PROGRESS_LINE, line) for line in lines), result.stderr
    assert re.fullmatch(r"flood_sample\.tif: 12/12 tiles \(100%\), \d+\.\d tiles/s, in \d+\S*", lines[-1]), lines


def run_on_a_terminal(*args):
    """`python -m appliance.cli ARGS` with stdout and stderr on one pseudo-terminal, as a user's shell
    has them; (exit code, everything it wrote). Reads until the terminal closes: no timing involved."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # a 120-column window
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "appliance.cli", *map(str, args)], stdin=subprocess.DEVNULL,
                            stdout=terminal, stderr=terminal, cwd=REPO, env=env)
    os.close(terminal)
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: every writer has closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(controller)
    return proc.wait(timeout=300), b"".join(chunks).decode("utf-8", "replace")


def test_progress_bar_on_a_terminal_ends_at_100_percent_and_the_result_starts_a_new_line(tmp_path):
    out = tmp_path / "mask.tif"
    code, text = run_on_a_terminal("run", "pipeline=prithvi_flood", f"input={SAMPLE}", f"output={out}",
                                   *SAMPLE_TILES)
    assert code == 0, text
    before, sep, after = text.partition(f"wrote {out}: ")
    assert sep, text
    assert before.endswith("\n"), repr(before[-200:])  # the bar left on its own line, the result below it
    bar = re.split(r"[\r\n]", before.rstrip("\r\n"))[-1]  # the bar as the terminal shows it last
    assert bar.startswith("flood_sample.tif: 100%") and "12/12" in bar, repr(bar)
    assert after.startswith("400x300, 12 tiles")
