"""The trainer, counting what the startup and the step loop do; same arguments and exit codes as train.py.

    TORCHTITAN_TEST_REPORT=OUT.json python tests/dist/train_instrumented.py --job.config_file ...

Writes to OUT.json (rank 0; OUT.json.<rank> for the others):
  reads_per_step   {step: calls of torchtitan.host_sync.to_host during that step}, the startup's under "0"
  init_calls       how many parameters were filled by the random init (0 when weights were loaded)
Used by tests/test_startup.py.
"""

import json
import os

from torchtitan import gc_policy

gc_policy.pause()  # as train.py: before torch's imports; train() resumes it

import torchtitan.host_sync as host_sync  # noqa: E402
import torchtitan.models.llama3.model as model_module  # noqa: E402
from torchtitan import watchdog  # noqa: E402
from torchtitan.parallel.distributed import exit_process  # noqa: E402
from torchtitan.train import main  # noqa: E402

counts = {"init_calls": 0, "reads_per_step": {}}
_reads_before = [0]


def _count_fill(original):
    def fill(*args, **kwargs):
        counts["init_calls"] += 1
        return original(*args, **kwargs)

    return fill


def _count_beat(original):
    def beat(self, step):
        counts["reads_per_step"][step] = host_sync.reads - _reads_before[0]
        _reads_before[0] = host_sync.reads
        return original(self, step)

    return beat


def _count_start(original):
    def init(self, *args, **kwargs):  # the watchdog starts right before step 1: what came before is startup
        counts["reads_per_step"][0] = host_sync.reads
        _reads_before[0] = host_sync.reads
        return original(self, *args, **kwargs)

    return init


if __name__ == "__main__":
    model_module.fill_normal = _count_fill(model_module.fill_normal)
    watchdog.Watchdog.beat = _count_beat(watchdog.Watchdog.beat)
    watchdog.Watchdog.__init__ = _count_start(watchdog.Watchdog.__init__)
    rc = main()
    out = os.environ["TORCHTITAN_TEST_REPORT"]
    rank = int(os.environ.get("RANK", 0))
    with open(out if rank == 0 else f"{out}.{rank}", "w") as f:
        json.dump(counts, f)
    exit_process(rc)  # as train.py: no interpreter teardown in a multi-process run
