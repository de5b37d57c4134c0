#!/usr/bin/env bash
# Build .gpu_bundle/: the wheels a GPU machine without registry access needs to run this package, its tests and
# scripts/bench_torchtitan.py, downloaded here for the GPU machine's Python (3.12, x86-64 Linux, CPython) with
# pip's cross-platform download options. torch itself is never downloaded: the GPU machine's CUDA build stays.
#
#   scripts/build_gpu_bundle.sh            # what the lent machines' image lacks (see below), ~10 MiB
#   scripts/build_gpu_bundle.sh --full     # also every other runtime/test need of ours (for a bare torch image)
#   scripts/install_gpu_bundle.sh          # on the GPU machine (docs/performance.md, "GPU runs: how to")
#
# Assumptions (the device image as listed in the workplace's KINDS.md, 2026-11-17): Python 3.12, torch 2.11.0+cu130,
# numpy, pyarrow, pandas, fsspec, huggingface-hub 1.33, requests, tqdm, xxhash, pyyaml, filelock, aiohttp,
# tensorboard, sentencepiece, safetensors, tokenizers, tiktoken, regex, transformers 5.17, einops, pillow,
# pytest and pytest-xdist are installed; torchao, datasets (and its dill, multiprocess), torchtitan and its
# torchdata, tyro (docstring-parser, typeguard) are not. Every wheel is fetched with --no-deps and pinned, so
# nothing pulls torch or numpy in; scripts/install_gpu_bundle.sh installs them with --no-deps too and then
# imports each module to show what is still missing.
#
# Versions: torchao 0.18.0 is the release built against torch 2.11 (its __init__ loads its C++ ops only for
# torch >= 2.11.0). torchtitan 0.2.2 (Feb 2026, the last release with TOML configs) is the newest PyPI release
# that runs on torch 2.11: its releases pin the torch nightly of their date, and 0.3.0 (Aug 2026) was validated
# against torch 2.14 and needs torch_checkpointing/spmd_types. Override any pin with NAME_VERSION variables below.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="${GPU_BUNDLE_DIR:-.gpu_bundle}"
FULL=0
for a in "$@"; do
    case "$a" in
        --full) FULL=1 ;;
        -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "error: unknown argument '$a' (valid: --full, --help)" >&2; exit 2 ;;
    esac
done

PYTHON="${PYTHON:-python3}"
TORCHAO_VERSION="${TORCHAO_VERSION:-0.18.0}"
DATASETS_VERSION="${DATASETS_VERSION:-5.2.0}"
TORCHTITAN_PEER_VERSION="${TORCHTITAN_PEER_VERSION:-0.2.2}"

# What the image lacks: ours (torchao, datasets + its two pure-Python needs the image lacks) and the peer's.
CORE=(
    "torchao==$TORCHAO_VERSION"
    "datasets==$DATASETS_VERSION" "dill==0.4.1" "multiprocess==0.70.19"
    "torchdata==0.11.0" "tyro==1.0.17" "docstring-parser==0.17.0" "typeguard==4.4.4"
)
# --full: the rest of our runtime and test needs (present on the lent image; for a machine that has only torch).
EXTRA=(
    "tensorboard==2.21.0" "tensorboard-data-server==0.7.2" "markdown==3.11.3" "werkzeug==3.1.8" "protobuf==7.36.2"
    "absl-py==2.5.1" "grpcio==1.85.1"
    "sentencepiece==0.2.3" "safetensors==0.8.0" "tokenizers==0.23.3" "tiktoken==0.14.0" "regex==2026.5.9"
    "transformers==5.23.0" "huggingface-hub==1.33.0" "hf-xet==1.8.0"
    "xxhash==4.1.0" "fsspec==2026.9.0"
)
PEER="torchtitan==$TORCHTITAN_PEER_VERSION"

PLATFORM=(
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64
)
download() {  # one spec at a time: pip resolves a whole command together, and a failure names its package
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --abi cp312 --abi abi3 --abi none "${PLATFORM[@]}" --platform any -d "$1" "$2" 2>&1 \
        | grep -v "^WARNING: Location" || true
    # pip's exit status is lost in the pipe: check that a wheel of this name and version is now there
    local name="${2%%==*}" version="${2##*==}"
    local norm
    norm="$(echo "$name" | tr '[:upper:]-' '[:lower:]_')"
    if ! ls "$1" | tr '[:upper:]' '[:lower:]' | grep -q "^${norm}-${version}-"; then
        echo "error: could not download $2 for CPython 3.12 manylinux x86-64" >&2
        exit 1
    fi
}

mkdir -p "$OUT/peer"
specs=("${CORE[@]}")
[ "$FULL" = 1 ] && specs+=("${EXTRA[@]}")
for s in "${specs[@]}"; do download "$OUT" "$s"; done
download "$OUT/peer" "$PEER" # installed apart (--target), so that its package never shadows ours

# Nothing here may be torch or a CUDA runtime: the machine's own build must stay.
if ls "$OUT" "$OUT/peer" | grep -E -i '^(torch-|nvidia_|triton-)'; then
    echo "error: a torch/CUDA wheel landed in $OUT; remove it" >&2
    exit 1
fi
size_kib=$(du -sk "$OUT" | cut -f1)
tree_kib=$(git ls-files -z | xargs -0 du -ck 2>/dev/null | tail -1 | cut -f1)
echo "$OUT: $(find "$OUT" -name '*.whl' | wc -l) wheels, $((size_kib / 1024)) MiB; with the tracked tree" \
    "($((tree_kib / 1024)) MiB) $(((size_kib + tree_kib) / 1024)) MiB of the device tool's 64 MiB carry limit"
if [ $((size_kib + tree_kib)) -gt $((60 * 1024)) ]; then
    echo "warning: over 60 MiB with the tree: drop --full or carry in two calls" >&2
fi
