# Sourced by run_train.sh and scripts/test.sh: pick (and if needed build) the Python environment.
#
#   1. an existing ./.venv, or the active virtualenv/conda env, or the system python3 if it already has
#      everything;
#   2. otherwise create ./.venv (reusing system site-packages, so an installed torch is not downloaded again)
#      and install into it.
# torch is installed first and explicitly: a CUDA build only where `nvidia-smi` finds a GPU, else the CPU build,
# so a CPU-only machine never pulls several GB of CUDA wheels. Override with TORCH_SPEC / TORCH_INDEX_URL.
# Sets $PY to the interpreter to use. $1 = "dev" also requires the test dependencies.

_tt_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_tt_mods="torch, torchao, tensorboard, datasets, sentencepiece, tokenizers, safetensors"
[ "${1:-}" = "dev" ] && _tt_mods="$_tt_mods, pytest, xdist, transformers"
# Present (find_spec, not import: importing them all cost ~3.5 CPU-s on every launch) and torch >= 2.11
_tt_check() { "$1" -c "import sys, importlib.util as u, importlib.metadata as m
missing = [n for n in '$_tt_mods'.split(', ') if u.find_spec(n) is None]
sys.exit(bool(missing) or tuple(int(x) for x in m.version('torch').split('+')[0].split('.')[:2]) < (2, 11))" 2>/dev/null; }

if [ -x "$_tt_root/.venv/bin/python" ]; then
    PY="$_tt_root/.venv/bin/python"
elif [ -n "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ]; then
    PY="$(command -v python)"
else
    PY="$(command -v python3)"
    if ! _tt_check "$PY"; then
        echo "[setup] creating $_tt_root/.venv" >&2
        "$PY" -m venv --system-site-packages "$_tt_root/.venv" || { echo "error: python3 -m venv failed (install python3-venv)" >&2; exit 2; }
        PY="$_tt_root/.venv/bin/python"
    fi
fi

if ! _tt_check "$PY"; then
    echo "[setup] installing torchtitan and its dependencies into $("$PY" -c 'import sys; print(sys.prefix)')" >&2
    if ! "$PY" -c "import torch" 2>/dev/null; then
        if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
            "$PY" -m pip install "${TORCH_SPEC:-torch>=2.11}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} || exit 1
        else
            # CPU-only: the "+cpu" local version exists only as a CPU wheel (PyTorch's CPU index, or a local wheel
            # house); if it cannot be found we stop rather than fall back to PyPI's CUDA build.
            "$PY" -m pip install "${TORCH_SPEC:-torch==2.13.0+cpu}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} \
                || "$PY" -m pip install "${TORCH_SPEC:-torch==2.13.0+cpu}" --index-url https://download.pytorch.org/whl/cpu \
                || { echo "error: no CPU build of torch found; set TORCH_SPEC/TORCH_INDEX_URL" >&2; exit 1; }
        fi
    fi
    extra=""; [ "${1:-}" = "dev" ] && extra="[dev]"
    "$PY" -m pip install -e "$_tt_root$extra" || exit 1
    _tt_check "$PY" || { echo "error: the environment at $PY is still missing one of: $_tt_mods" >&2; exit 1; }
fi
export PYTHONPATH="$_tt_root${PYTHONPATH:+:$PYTHONPATH}"
