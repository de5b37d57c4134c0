"""How the multi-process test scripts leave after everything they check has passed."""

import os
import sys

import torch.distributed as dist


def leave() -> None:
    """Leave together, then skip the interpreter's teardown.

    The barrier: gloo aborts a peer whose pairs close mid-teardown. os._exit: even after the barrier and
    destroy_process_group, a C++ thread is sometimes destroyed unjoined at interpreter exit ("terminate called
    without an active exception", SIGABRT), seen in TP 2 runs (with and without torchao's float8 imported) on a
    loaded machine; the trainer has the same race, not yet fixed at its root."""
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
