#!/usr/bin/env bash
# The CUDA checks (docs/engine.md, "GPU checks"), for any machine with a CUDA GPU and a CUDA torch.
# A GPU machine without a package index gets the other packages as wheels:
#   bash scripts/gpu_checks.sh prepare   # where pip can download: wheels into .whl/ (git-ignored, ~30 MB)
#   bash scripts/gpu_checks.sh run       # on the GPU machine, with .whl/ beside the repository's files
# `run` prints the versions and whether xformers' C++ extension loaded, runs the CUDA tests and the
# xformers dispatch/backend tests (against the installed xformers), then one throughput row of the
# engine benchmark on the GPU beside transformers' generate on the same GPU. The log is also written
# to $OUT/gpu_checks.log when $OUT is set. Extra arguments to `run` go to pytest (e.g. -k xformers).
set -euo pipefail
cd "$(dirname "$0")/.."
# Same versions as the CPU install; antlr4 4.9.3 exists only as an sdist, so it is built here.
BINARY="hydra-core==1.3.8 omegaconf==2.3.1 rasterio==1.4.4 affine==3.0.1 cligj==0.7.2 click-plugins==1.1.1.2
        xformers==0.0.35"
SOURCE="antlr4-python3-runtime==4.9.3"
TESTS="tests/engine/test_cuda.py tests/engine/test_attention_backend.py tests/engine/test_xformers_plan.py
       tests/engine/test_xformers_backend.py tests/engine/test_engine_config_check.py"

versions() {
  python3 - <<'EOF'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "|", torch.cuda.get_device_name(),
      "capability", torch.cuda.get_device_capability())
print("torch flash attention available:", torch.backends.cuda.is_flash_attention_available())
try:
    import triton
    print("triton", triton.__version__)
except ImportError as e:
    print("triton: not importable:", e)
try:
    import xformers
    from xformers import _cpp_lib
    from xformers.ops import fmha
    error = _cpp_lib._cpp_library_load_exception
    print("xformers", xformers.__version__, "| C++ extension:",
          "loaded" if _cpp_lib._built_with_cuda else f"NOT loaded ({str(error).strip().splitlines()[0] if error else 'no CUDA build'})")
    print("xformers flash.FwOp:", fmha.flash.FwOp.NAME, "available" if fmha.flash.FwOp.is_available() else "unavailable",
          "| triton_splitk.FwOp:", "available" if fmha.triton_splitk.FwOp.is_available() else "unavailable")
except Exception as e:  # an xformers built for another torch can fail to import at all
    print("xformers: import failed:", type(e).__name__, str(e).strip().splitlines()[0])
EOF
}

checks() {
  nvidia-smi -L
  versions
  local status=0
  python3 -m pytest -q -s -p no:cacheprovider -rs $TESTS "$@" || status=$?
  echo "== engine throughput on the GPU (bf16, 32 requests) beside transformers generate on the same GPU"
  python3 benchmarks/engine_throughput.py --device cuda --dtype bfloat16 --num-requests 32 --hf-requests 4 \
    --skip-torch-kernels --skip-bf16 || status=$?
  return $status
}

case "${1:-}" in
  prepare)
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d .whl $BINARY
    python3 -m pip wheel -q --no-deps -w .whl $SOURCE
    ls -l .whl ;;
  run)
    shift
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
    set -o pipefail
    checks "$@" 2>&1 | tee "${OUT:-/tmp}/gpu_checks.log" ;;
  *)
    echo "usage: bash scripts/gpu_checks.sh prepare|run [pytest args]" >&2
    exit 2 ;;
esac
