"""benchmarks/region_search.py --quick: the tests' STAC API and range server, a search mapped by one worker and
by two shares (then assembled), each row counting every item of the collection."""
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.stac_api import unavailable


@pytest.mark.slow
def test_the_region_benchmark_maps_the_search_with_one_and_two_workers(tmp_path):
    reason = unavailable()
    if reason:
        pytest.skip(f"no STAC API: {reason}")
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "region_search.py"), "--quick"],
                            capture_output=True, text=True, timeout=900, cwd=tmp_path,
                            env={"PYTHONPATH": str(REPO), "PATH": os.environ["PATH"]})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "prithvi_demo_flood, 4 items of 256²" in result.stdout
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in result.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| workers")]
    cpus = os.cpu_count()
    assert [(r[0], r[1], r[3]) for r in rows] == [("1", str(cpus), "4"), ("2", str(max(1, cpus // 2)), "4")]
    for r in rows:
        assert float(r[6]) > 0  # items/min
        assert 0 < float(r[7].rstrip("%")) < 100  # the time outside the model: some, not all
