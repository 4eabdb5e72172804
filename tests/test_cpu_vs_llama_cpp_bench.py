"""benchmarks/cpu_vs_llama_cpp.py at toy shapes: it serves the built model with int8 weights on AVX2 code
whatever this CPU has (--isa avx2), measures it, and says which systems it skipped."""
import subprocess
import sys

import pytest

from appliance.engine import cpu_kernels
from tests.conftest import REPO


@pytest.mark.slow
@pytest.mark.skipif(not cpu_kernels.available(), reason="our CPU kernels are not built here")
def test_the_comparison_runs_ours_on_avx2_code_and_skips_llama_cpp_without_it(tmp_path):
    script = REPO / "benchmarks" / "cpu_vs_llama_cpp.py"
    result = subprocess.run([sys.executable, str(script), str(tmp_path), "--shape", "tiny", "--threads", "1",
                             "--tokens", "4", "--isa", "avx2", "--systems", "ours-int8,llama-q8_0"],
                            capture_output=True, text=True, timeout=900,
                            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    [row] = [line for line in out.splitlines() if line.startswith("| ours-int8 |")]
    prefill, one_stream = row.split("|")[3:5]
    # At toy size a stream's tokens may share one chunk (the same arrival): its ms/token can read 0.
    assert float(prefill.split()[0]) > 0 and float(one_stream.split()[0]) >= 0 and "ms/token" in one_stream
    assert "gemm int8 every row=ours packed (avx2 vpmaddubsw)" in out  # the plan of a CPU without VNNI
    assert "llama-q8_0: skipped (no --llama-python)" in out
    assert "host fp32 GEMM" in out and "isa avx2" in out
