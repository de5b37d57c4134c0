"""The trainer with torch's context-parallel ring attention made available on CPU (tests/cp_cpu_kernel.py).

    torchrun --nproc_per_node 2 tests/dist/train_cp_cpu.py --job.config_file ... \\
        --parallelism.context_parallel_degree=2

Same arguments and exit codes as train.py; used by tests/test_parity_cp.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for cp_cpu_kernel

from torchtitan import gc_policy  # noqa: E402

gc_policy.pause()  # as train.py: before torch's imports; each run's train() resumes it

import cp_cpu_kernel  # noqa: E402

from torchtitan.parallel.distributed import exit_process  # noqa: E402
from torchtitan.train import main  # noqa: E402

if __name__ == "__main__":
    cp_cpu_kernel.install()
    exit_process(main())  # as train.py: no interpreter teardown in a multi-process run
