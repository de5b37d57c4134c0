#!/usr/bin/env bash
# Run the whole test suite (sets up the environment first, like run_train.sh). Extra args go to pytest:
#   ./scripts/test.sh                 # everything
#   ./scripts/test.sh tests/test_config.py -x
#   TEST_WORKERS=0 ./scripts/test.sh ...   # one process (pytest-xdist's -n 3 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh dev
export HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
set +e
# Three pytest workers (TEST_WORKERS=0: none), whole files per worker: many tests wait (SLURM's requeue, timeouts,
# watchdogs, torchrun's grace) rather than compute, and a third worker fills those waits: on this project's 2-core
# VM the suite took 636 s with 3 workers against 716 s with 2 (docs/testing.md). Files start in collection order,
# which tests/conftest.py sorts longest first (xdist's default reorder by test count started the long
# multi-process files with few tests last, where they ran alone).
workers=(-n "${TEST_WORKERS:-3}" --dist loadfile --no-loadscope-reorder)
[ "${TEST_WORKERS:-3}" = "0" ] && workers=()
"$PY" -m pytest "${workers[@]}" "$@"
rc=$?
set -e
# pytest exits 5 when it collected nothing: a suite that ran no test must not look green.
if [ "$rc" -eq 5 ]; then
    echo "error: pytest collected no tests" >&2
    exit 1
fi
exit "$rc"
