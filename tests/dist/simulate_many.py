"""Run several fake-backend simulations (or error cases) in one process, one after the other.

    python tests/dist/simulate_many.py RUNS.json      # [[arg, ...], ...] -> prints [exit code, ...] as JSON

Saves the interpreter and torch start-up per run (tests/test_simulate.py). Not for two pipeline layouts of the
same world and mesh in a row: torch's cached process-group names then point at the previous run's groups. torch's context-parallel ring
attention gets the CPU kernel first (tests/cp_cpu_kernel.py), so context-parallel layouts run too.
"""

import contextlib
import gc
import io
import json
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for cp_cpu_kernel

import cp_cpu_kernel  # noqa: E402

from torchtitan.train import main  # noqa: E402

if __name__ == "__main__":
    cp_cpu_kernel.install()
    results = []
    for argv in json.loads(Path(sys.argv[1]).read_text()):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except Exception:  # a crash is this run's result, not the end of the others
                traceback.print_exc()
                rc = 1
        results.append({"rc": rc, "stderr": err.getvalue()[-2000:]})
        gc.collect()  # the trainer disables the cyclic GC during a run
    print("RESULTS " + json.dumps(results))
