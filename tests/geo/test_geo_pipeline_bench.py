"""benchmarks/geo_pipeline.py at toy size, on a one-date TL model (its forward takes the coordinates the
pipeline gives) and on the 3-date crops model (the scene read as each of its dates, the bare forward on
[batch, C, T, S, S]): every run covers the scene's tiles."""
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.slow
@pytest.mark.parametrize("pipeline, model, frames", [("prithvi_flood", "prithvi_tiny_tl_flood", 1),
                                                     ("prithvi_crops", "prithvi_demo_crops", 3)])
def test_the_geo_benchmark_runs_one_and_three_date_models(tmp_path, pipeline, model, frames):
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "geo_pipeline.py"), "--pipeline", pipeline,
                             "--model", model, "--quick", "--skip-rss", "--threads", "1"],
                            capture_output=True, text=True, timeout=900, cwd=tmp_path,
                            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"({frames} date(s) a tile)" in result.stdout
    rows = {line.split("|")[1].strip(): line.split("|")[2:] for line in result.stdout.splitlines()
            if line.startswith("| ") and "float32" in line}
    expected = {"bare forward (pre-made batches)", "pipeline, stride = tile", "pipeline, default overlap"}
    assert set(rows) == (expected if frames > 1 else expected | {"naive loop (reference-like)"})
    assert int(rows["pipeline, stride = tile"][1]) == int(rows["bare forward (pre-made batches)"][1]) == 4
    assert float(rows["pipeline, stride = tile"][4]) > 0  # tiles/s
