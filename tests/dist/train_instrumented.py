"""The trainer, counting what the startup and the step loop do; same arguments and exit codes as train.py.

    TORCHTITAN_TEST_REPORT=OUT.json python tests/dist/train_instrumented.py --job.config_file ...

Writes to OUT.json (rank 0; OUT.json.<rank> for the others):
  reads_per_step   {step: calls of torchtitan.host_sync.to_host during that step}, the startup's under "0"
  init_calls       how many parameters were filled by the random init (0 when weights were loaded)
  gathers_per_step {step: calls of torch.distributed's all-gather into one tensor during that step} (FSDP2's
                   parameter all-gathers: one a unit and gather; the trainer's other collectives are all-reduces,
                   pipeline sends and receives, and DTensor's functional collectives)
Used by tests/test_startup.py and tests/test_estimate_fsdp_gathers.py.
"""

import json
import os

from torchtitan import gc_policy

gc_policy.pause()  # as train.py: before torch's imports; train() resumes it

import torch.distributed as dist  # noqa: E402

import torchtitan.host_sync as host_sync  # noqa: E402
import torchtitan.models.llama3.model as model_module  # noqa: E402
from torchtitan import watchdog  # noqa: E402
from torchtitan.parallel.distributed import exit_process  # noqa: E402
from torchtitan.train import main  # noqa: E402

counts = {"init_calls": 0, "reads_per_step": {}, "gathers_per_step": {}}
_reads_before = [0]
_gathers = [0, 0]  # calls so far, calls when the step began
# FSDP2 all-gathers with dist.all_gather_single (torch 2.13; all_gather_into_tensor before it)
_GATHER = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"


def _count_gather(original):
    def gather(*args, **kwargs):
        _gathers[0] += 1
        return original(*args, **kwargs)

    return gather


def _count_fill(original):
    def fill(*args, **kwargs):
        counts["init_calls"] += 1
        return original(*args, **kwargs)

    return fill


def _count_beat(original):
    def beat(self, step):
        counts["reads_per_step"][step] = host_sync.reads - _reads_before[0]
        _reads_before[0] = host_sync.reads
        counts["gathers_per_step"][step] = _gathers[0] - _gathers[1]
        _gathers[1] = _gathers[0]
        return original(self, step)

    return beat


def _count_start(original):
    def init(self, *args, **kwargs):  # the watchdog starts right before step 1: what came before is startup
        counts["reads_per_step"][0] = host_sync.reads
        _reads_before[0] = host_sync.reads
        counts["gathers_per_step"][0] = _gathers[1] = _gathers[0]
        return original(self, *args, **kwargs)

    return init


if __name__ == "__main__":
    model_module.fill_normal = _count_fill(model_module.fill_normal)
    watchdog.Watchdog.beat = _count_beat(watchdog.Watchdog.beat)
    watchdog.Watchdog.__init__ = _count_start(watchdog.Watchdog.__init__)
    setattr(dist, _GATHER, _count_gather(getattr(dist, _GATHER)))
    rc = main()
    out = os.environ["TORCHTITAN_TEST_REPORT"]
    rank = int(os.environ.get("RANK", 0))
    with open(out if rank == 0 else f"{out}.{rank}", "w") as f:
        json.dump(counts, f)
    exit_process(rc)  # as train.py: no interpreter teardown in a multi-process run
