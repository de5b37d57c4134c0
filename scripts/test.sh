#!/usr/bin/env bash
# Run the whole test suite (sets up the environment first, like run_train.sh). Extra args go to pytest:
#   ./scripts/test.sh                 # everything
#   ./scripts/test.sh tests/test_config.py -x
#   TEST_WORKERS=0 ./scripts/test.sh ...   # one process (pytest-xdist's -n 2 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh dev
export HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
set +e
# Two pytest workers (TEST_WORKERS=0: none), whole files per worker: most tests wait on subprocesses (torchrun,
# timeouts, watchdogs) rather than compute, so two overlap well even on 2 cores. Files start in collection order,
# which tests/conftest.py sorts longest first (xdist's default reorder by test count started the long
# multi-process files with few tests last, where they ran alone).
workers=(-n "${TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder)
[ "${TEST_WORKERS:-2}" = "0" ] && workers=()
"$PY" -m pytest "${workers[@]}" "$@"
rc=$?
set -e
# pytest exits 5 when it collected nothing: a suite that ran no test must not look green.
if [ "$rc" -eq 5 ]; then
    echo "error: pytest collected no tests" >&2
    exit 1
fi
exit "$rc"
