#!/usr/bin/env bash
# The CUDA checks (tests/engine/test_cuda.py) for a session that is lent a GPU. The device machine has
# torch, transformers, safetensors and tokenizers but no package index, so the rest travels as wheels:
#   here:        bash scripts/gpu_checks.sh prepare    # downloads wheels into .whl/ (git-ignored, ~30 MB)
#   on the GPU:  bash scripts/gpu_checks.sh run        # through the device tool, with carry [".whl"]
# Extra arguments to `run` go to pytest (e.g. -k xformers).
set -euo pipefail
cd "$(dirname "$0")/.."
# Same versions as the CPU install; antlr4 4.9.3 exists only as an sdist, so it is built here.
BINARY="hydra-core==1.3.8 omegaconf==2.3.1 rasterio==1.4.4 affine==3.0.1 cligj==0.7.2 click-plugins==1.1.1.2
        xformers==0.0.35"
SOURCE="antlr4-python3-runtime==4.9.3"

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
    nvidia-smi -L
    python3 -c "import torch, xformers; print('torch', torch.__version__, 'xformers', xformers.__version__, torch.cuda.get_device_name())"
    python3 -m pytest -q -p no:cacheprovider -rs tests/engine/test_cuda.py tests/engine/test_attention_backend.py "$@" ;;
  *)
    echo "usage: bash scripts/gpu_checks.sh prepare|run [pytest args]" >&2
    exit 2 ;;
esac
