"""Several training runs in one process per rank, one after the other, each as `train.py ARGS` runs it.

    python tests/dist/train_many.py RUNS.json                                   # simulations, error cases
    torchrun --nproc_per_node 4 tests/dist/train_many.py RUNS.json --together   # layouts of one world size

RUNS.json: [[arg, ...], ...]. Rank 0 prints `RESULTS [{"rc": ..., "stderr": ...}, ...]`, one entry per run.
Saves the interpreter's, torch's and torchrun's start-up per run (tests/test_simulate.py, the parity tests):
tests/test_parity.py's 4 layouts in one 4-rank torchrun took 52 CPU-s against 82 for 4 torchruns, with
metrics.jsonl identical to the separate runs'. Each run creates and destroys its own default process group.
Alone, a failed run is its result (with its stderr) and the next one runs, and the script exits 0. With
--together (the ranks of one torchrun world) stderr stays on the console and the ranks stop at the first failed
run, whose peers may be waiting in a collective, exiting with its code.
Between runs DTensor's sharding-propagation caches are cleared, as a new process starts: without that a run whose
mesh compares equal to an earlier run's got the earlier mesh, whose process groups are destroyed, in its
gradients' specs (gloo, FSDP 2 x TP 2 then CP 2 x TP 2 in one 4-rank torchrun: "Could not resolve the process
group registered under the name 19" in clip_grad_norm_). With the fake backend, not for two pipeline layouts of
the same world and mesh in a row: torch's cached process-group names then point at the previous run's groups
(seen before the caches were cleared; not tried since). torch's context-parallel ring attention gets the CPU
kernel first (tests/cp_cpu_kernel.py), so context-parallel layouts run too.
"""

import contextlib
import faulthandler
import gc
import io
import json
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for cp_cpu_kernel

from torchtitan import gc_policy  # noqa: E402

gc_policy.pause()  # as train.py: before torch's imports; each run's train() resumes it

import cp_cpu_kernel  # noqa: E402
from torch.distributed.tensor.debug import _clear_sharding_prop_cache  # noqa: E402

from torchtitan.parallel.distributed import exit_process  # noqa: E402
from torchtitan.train import main  # noqa: E402

if __name__ == "__main__":
    # a rank killed by a signal (SIGSEGV, once, in the CP parity runs' shared torchrun) prints its Python stack
    if not faulthandler.is_enabled():
        faulthandler.enable()
    cp_cpu_kernel.install()
    together = "--together" in sys.argv[2:]
    results = []
    for argv in json.loads(Path(sys.argv[1]).read_text()):
        err = io.StringIO()
        with contextlib.nullcontext() if together else contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except Exception:  # a crash is this run's result, not the end of the others
                traceback.print_exc()
                rc = 1
        results.append({"rc": rc, "stderr": err.getvalue()[-2000:]})
        gc.collect()  # the trainer disables the cyclic GC during a run
        # DTensor's sharding-propagation caches outlive the run: a later run whose mesh compares equal to this one's
        # would get output specs holding this run's mesh, whose process groups are destroyed ("Could not resolve the
        # process group registered under the name ..."). A new process starts with them empty.
        _clear_sharding_prop_cache()
        if together and rc:
            break
    if os.environ.get("RANK", "0") == "0":
        print("RESULTS " + json.dumps(results), flush=True)
    exit_process(results[-1]["rc"] if together and results else 0)
