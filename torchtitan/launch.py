"""How scripts and tests start the trainer (or any script) on N local processes, the way a user would."""

from __future__ import annotations

import sys


def local_command(nproc: int, script: str, torchrun_args: tuple[str, ...] = ()) -> list[str]:
    """`python script` for one process without torchrun_args, else `torchrun --standalone --nproc_per_node N`."""
    if nproc == 1 and not torchrun_args:
        return [sys.executable, script]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        *torchrun_args,
        script,
    ]
