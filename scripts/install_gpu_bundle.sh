#!/usr/bin/env bash
# Install .gpu_bundle/ (built by scripts/build_gpu_bundle.sh) on a machine without registry access, e.g. a lent GPU
# machine, then import every bundled module to prove it. Run from the repository root, on that machine:
#
#   scripts/install_gpu_bundle.sh                      # into python3's environment (the image's torch stays)
#   scripts/install_gpu_bundle.sh --python /path/to/venv/bin/python --peer-dir /tmp/torchtitan_peer
#   scripts/install_gpu_bundle.sh --no-torch           # check the bundle on a machine without torch (CPU check)
#
# Every wheel is installed with --no-index --no-deps (nothing is fetched, torch is never replaced). PyPI's
# torchtitan (the peer for scripts/bench_torchtitan.py) goes into its own folder with --target, because its package
# name is ours too: only a process whose PYTHONPATH starts with that folder imports it. Afterwards `pip check`
# lines about the bundled packages are printed (a requirement the image does not meet), and the bundled modules
# are imported: exit 1 if one fails.
set -uo pipefail
cd "$(dirname "$0")/.."

PY=python3
BUNDLE="${GPU_BUNDLE_DIR:-.gpu_bundle}"
PEER_DIR=/tmp/torchtitan_peer
NEED_TORCH=1
while [ $# -gt 0 ]; do
    case "$1" in
        --python) PY="$2"; shift 2 ;;
        --peer-dir) PEER_DIR="$2"; shift 2 ;;
        --bundle) BUNDLE="$2"; shift 2 ;;
        --no-torch) NEED_TORCH=0; shift ;;
        -h | --help) sed -n '2,14p' "$0"; exit 0 ;;
        *) echo "error: unknown argument '$1' (valid: --python PY, --peer-dir DIR, --bundle DIR, --no-torch)" >&2; exit 2 ;;
    esac
done
if ! ls "$BUNDLE"/*.whl >/dev/null 2>&1; then
    echo "error: no wheels in $BUNDLE: build it with scripts/build_gpu_bundle.sh and carry it (device tool: carry [\"$BUNDLE\"])" >&2
    exit 2
fi

if [ "$NEED_TORCH" = 1 ]; then
    "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'devices', torch.cuda.device_count())" \
        || { echo "error: $PY has no torch (the bundle never brings it); pass --no-torch to check the rest" >&2; exit 1; }
fi

set -e
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check "$BUNDLE"/*.whl
if ls "$BUNDLE"/peer/*.whl >/dev/null 2>&1; then
    rm -rf "$PEER_DIR"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
        --target "$PEER_DIR" "$BUNDLE"/peer/*.whl
fi
set +e

# Requirements of the bundled packages that the environment does not meet (--no-deps skipped them).
names=$(for w in "$BUNDLE"/*.whl; do basename "$w" | cut -d- -f1 | tr '[:upper:]_' '[:lower:]-'; done | sort -u)
"$PY" -m pip check 2>/dev/null | tr '[:upper:]_' '[:lower:]-' | grep -E "^($(echo $names | tr ' ' '|')) " \
    | sed 's/^/[pip check] /' || true

fail=0
check() {  # $1 = label, rest = python code
    local label="$1"; shift
    if out=$("$@" 2>&1); then
        echo "ok    $label ${out##*$'\n'}"
    else
        echo "FAIL  $label: ${out##*$'\n'}"; fail=1
    fi
}
pure="import datasets, dill, multiprocess, tyro, docstring_parser, typeguard; print('datasets', datasets.__version__)"
check "datasets, tyro" "$PY" -c "$pure"
if [ "$NEED_TORCH" = 1 ]; then
    check torchao "$PY" -c "import torchao, torchao.float8; print('torchao', torchao.__version__)"
    check torchdata "$PY" -c "import torchdata.stateful_dataloader; print('torchdata ok')"
    check "our package" env PYTHONPATH="$PWD" "$PY" -c \
        "import torchtitan.train, torchtitan.quantize.float8 as f; print('ours from', torchtitan.train.__file__)"
    if [ -d "$PEER_DIR/torchtitan" ]; then
        # from an empty folder, so neither this repo nor the current directory is on sys.path
        check "torchtitan (PyPI)" env -C /tmp PYTHONPATH="$PEER_DIR" "$PY" -c \
            "import torchtitan, torchtitan.train, torchtitan.models.llama3 as m; print('peer', torchtitan.__version__, 'from', torchtitan.__file__)"
    fi
else
    check "torchao (files only: needs torch)" "$PY" -c \
        "import importlib.util as u; s = u.find_spec('torchao'); assert s; print('torchao at', s.origin)"
    [ -d "$PEER_DIR/torchtitan" ] && check "torchtitan (PyPI) files" test -f "$PEER_DIR/torchtitan/train.py"
fi
exit $fail
