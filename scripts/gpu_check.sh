#!/usr/bin/env bash
# Validate an install on this machine's GPU(s) (or CPU): the CUDA-only tests, then a smoke matrix on the debug
# model, one line per check and a summary; exit 1 on any failure. `scripts/gpu_check.sh --help` lists the options,
# scripts/gpu_check.py holds the checks, docs/performance.md ("GPU runs: how to") says how to run it on a lent GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PY:-}" ]; then
    # an interpreter that already has torch and our needs (e.g. a GPU image plus scripts/install_gpu_bundle.sh)
    # is used as it is; otherwise scripts/env.sh picks or builds the project's environment
    if python3 -c "import torch, torchao, datasets, tensorboard, transformers, pytest" 2>/dev/null; then
        PY=python3
    else
        source scripts/env.sh dev
    fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" scripts/gpu_check.py "$@"
