#!/usr/bin/env bash
# Train on this machine: all local GPUs, or 2 CPU processes (gloo) when there is none.
#
#   ./run_train.sh                                            # debug model, default config
#   CONFIG_FILE=train_configs/llama3_8b.toml NGPU=8 ./run_train.sh --training.steps=50
#   LOG_RANK=0,1 ./run_train.sh                               # which ranks print to the console ("all" = every rank)
#   ./run_train.sh --help                                     # every config option
#   kill -TERM <pid of this script>                           # trainers save (checkpoint.enable=true), exit 75
#
# Environment: CONFIG_FILE (default train_configs/debug_model.toml), NGPU or NPROC (processes on this node),
# LOG_RANK (default 0), PYTORCH_ALLOC_CONF (on GPUs default expandable_segments:True). Extra arguments are config
# overrides (--section.key=value).
set -euo pipefail
cd "$(dirname "$0")"
source scripts/env.sh

CONFIG_FILE="${CONFIG_FILE:-train_configs/debug_model.toml}"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    default_nproc="$(nvidia-smi -L | wc -l)"
    # CUDA caching allocator: expandable segments grow one mapping instead of leaving fragments (docs/launching.md);
    # a setting of yours under either name wins
    if [ -z "${PYTORCH_ALLOC_CONF:-}${PYTORCH_CUDA_ALLOC_CONF:-}" ]; then
        export PYTORCH_ALLOC_CONF=expandable_segments:True
    fi
else
    default_nproc=2
fi
NPROC="${NGPU:-${NPROC:-$default_nproc}}"
export LOG_RANK="${LOG_RANK:-0}"

# Check the config, the mesh for this world size and the tokenizer in one process first: a mistake is one
# line and exit code 2, instead of N tracebacks from torchrun's workers.
"$PY" -m torchtitan.preflight --world_size "$NPROC" --job.config_file "$CONFIG_FILE" "$@" || exit $?
for arg in "$@"; do [ "$arg" = "--help" ] || [ "$arg" = "-h" ] && exit 0; done

# torchrun, run by torchtitan.launch: SIGTERM/SIGUSR1 to this script go to the trainers (which save and exit 75), and
# the script exits with the trainers' exit code (torchrun alone would exit 1 whatever they said: docs/launching.md).
exec "$PY" -m torchtitan.launch --standalone --nnodes 1 --nproc_per_node "$NPROC" \
    train.py --job.config_file "$CONFIG_FILE" "$@"
