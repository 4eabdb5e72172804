"""Geospatial faults, through `appliance run pipeline=prithvi_flood` as users run it (subprocesses, the
embedded demo model): interrupted runs, a corrupt block mid-scene, a full disk, and two runs racing
for one output. (Read-only and unwritable output directories are refused before any compute:
tests/geo/test_bad_inputs.py and tests/geo/test_cli_e2e.py.) In every case the output directory ends with a whole
mask or nothing: no partial file,
no temp file."""
import os
import resource
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import rasterio

from tests.conftest import REPO, assert_user_error, run_cli


def write_scene(path, side, seed=0, tile=256):
    rng = np.random.default_rng(seed)
    data = (rng.random((6, side, side)) * 3000).astype("uint16")
    with rasterio.open(path, "w", driver="GTiff", height=side, width=side, count=6, dtype="uint16",
                       crs="EPSG:32615", transform=rasterio.Affine(30, 0, 0, 0, -30, 0), tiled=True,
                       blockxsize=tile, blockysize=tile, compress="deflate") as dst:
        dst.write(data)
    return path


def start_run(scene, out, **popen):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "appliance.cli", "run", "pipeline=prithvi_flood",
                             f"input={scene}", f"output={out}"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


def wait_for_first_tiles(proc, out, timeout=60):
    """Until the run's temporary output exists: the model is loaded and tiles are running (a 4096^2 scene
    is ~100 tiles: several seconds). A fixed sleep could signal a slow host's run while it still imports,
    before the CLI handles signals."""
    deadline = time.monotonic() + timeout
    while not os.listdir(out):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)


@pytest.mark.parametrize("sig,code,word,times", [(signal.SIGINT, 130, "interrupted", 1),
                                                  (signal.SIGTERM, 143, "terminated", 1),
                                                  (signal.SIGINT, 130, "interrupted", 3)],
                         ids=["ctrl-c", "sigterm", "ctrl-c-repeated"])
def test_an_interrupted_run_leaves_no_partial_output(tmp_path, sig, code, word, times):
    """One signal, or Ctrl-C pressed again while the run cleans up: exit 130 / 143, nothing left."""
    scene = write_scene(tmp_path / "big.tif", 4096)
    out = tmp_path / "out"
    out.mkdir()
    proc = start_run(scene, out / "mask.tif")
    wait_for_first_tiles(proc, out)
    for _ in range(times):
        proc.send_signal(sig)
        time.sleep(0.01)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == code, stderr
    assert stderr.strip().splitlines()[-1] == f"appliance run: {word}", stderr
    assert os.listdir(out) == []


def test_a_corrupt_block_mid_scene_names_the_window(tmp_path):
    scene = write_scene(tmp_path / "scene.tif", 1024, tile=256)
    with rasterio.open(scene) as ds:
        offset = int(ds.get_tag_item("BLOCK_OFFSET_2_2", "TIFF", bidx=1))  # the block at rows/cols 512..767
        size = int(ds.get_tag_item("BLOCK_SIZE_2_2", "TIFF", bidx=1))
    with open(scene, "r+b") as f:
        f.seek(offset)
        f.write(b"\xff" * size)  # still inside the file: only reading the block finds it
    out = tmp_path / "out"
    out.mkdir()
    result = run_cli("run", "pipeline=prithvi_flood", f"input={scene}", f"output={out / 'mask.tif'}")
    assert_user_error(result, "scene.tif: cannot read the window of rows", "corrupt")
    line = result.stderr.strip()
    rows = [int(v) for v in line.split("rows ")[1].split(",")[0].split("..")]
    cols = [int(v) for v in line.split("columns ")[1].split(" ")[0].split("..")]
    assert rows[0] <= 767 and rows[1] >= 512 and cols[0] <= 767 and cols[1] >= 512, line
    assert os.listdir(out) == []


def test_a_full_disk_fails_cleanly_and_leaves_nothing(tmp_path):
    """The run may write at most 64 KiB (RLIMIT_FSIZE: a disk that fills mid-write): one clear error."""
    scene = write_scene(tmp_path / "scene.tif", 2048)
    out = tmp_path / "out"
    out.mkdir()

    def small_disk():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead

    proc = start_run(scene, out / "mask.tif", preexec_fn=small_disk)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2, stderr
    # libtiff itself may print "_tiffWriteProc: File too large." lines first (from C, when GDAL flushes
    # the mask's blocks while the scene is being read), and a slow run progress lines; ours is the one
    # error line, last.
    lines = stderr.strip().splitlines()
    assert lines[-1].startswith("appliance run: error: output: writing") and "nothing was written" in lines[-1]
    assert "Traceback" not in stderr, stderr
    assert all("File too large" in line or line.startswith("scene.tif: ") for line in lines[:-1]), stderr
    assert os.listdir(out) == []


def test_two_runs_racing_for_one_output_never_interleave(tmp_path):
    scenes = [write_scene(tmp_path / f"s{i}.tif", 1024, seed=i) for i in range(2)]
    expected = []
    for i, scene in enumerate(scenes):  # each run's mask alone
        result = run_cli("run", "pipeline=prithvi_flood", f"input={scene}", f"output={tmp_path / f'alone{i}.tif'}")
        assert result.returncode == 0, result.stderr
        expected.append(rasterio.open(tmp_path / f"alone{i}.tif").read())
    out = tmp_path / "out"
    out.mkdir()
    procs = [start_run(scene, out / "mask.tif") for scene in scenes]
    codes = [p.wait(timeout=120) for p in procs]
    # Both may finish (the later rename wins) or the second may find the first's mask and refuse: either
    # way the file is one whole mask, never a mix.
    assert 0 in codes, [p.stderr.read() for p in procs]
    assert sorted(os.listdir(out)) == ["mask.stac.json", "mask.tif"]  # and no temp files
    got = rasterio.open(out / "mask.tif").read()
    assert any(np.array_equal(got, e) for e in expected)
