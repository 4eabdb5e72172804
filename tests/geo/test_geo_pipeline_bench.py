"""benchmarks/geo_pipeline.py on the 3-date crops model at toy size: its pipeline runs read the scene as
each of the three dates and cover every tile, and the bare forward takes [batch, C, T, S, S]."""
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_the_geo_benchmark_runs_a_three_date_model(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "geo_pipeline.py"), "--pipeline", "prithvi_crops",
                             "--model", "prithvi_demo_crops", "--quick", "--skip-rss", "--threads", "1"],
                            capture_output=True, text=True, timeout=900, cwd=tmp_path,
                            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "(3 date(s) a tile)" in result.stdout
    rows = {line.split("|")[1].strip(): line.split("|")[2:] for line in result.stdout.splitlines()
            if line.startswith("| ") and "float32" in line}
    assert set(rows) == {"bare forward (pre-made batches)", "pipeline, stride = tile", "pipeline, default overlap"}
    assert int(rows["pipeline, stride = tile"][1]) == int(rows["bare forward (pre-made batches)"][1]) == 4
    assert float(rows["pipeline, stride = tile"][4]) > 0  # tiles/s
