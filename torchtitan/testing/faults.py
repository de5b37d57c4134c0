"""Every fault the tests inject into the real entry points, driven by environment variables, in one place.

The tests run `train.py`, `torchrun` and the scripts as a user would; to make them hang, crash, run out of memory
or fail a write at a chosen moment they set one of the variables below. Production code never reads them itself:
it calls the function named for its point (`faults.hook_stall(step, rank)`, `faults.kill_at("save_marked", ...)`),
which does nothing unless its variable is set. tests/test_fault_hooks.py fails if a TORCHTITAN_TEST_ variable is
read anywhere else in the package or is missing from VARIABLES; docs/testing.md lists the same variables.

    variable                           read by           effect
    TORCHTITAN_TEST_FAULT              kill_at           "<point>:<step>[:<rank>]": SIGKILL this process at that
                                                         point (first torchrun attempt only; KILL_POINTS)
    TORCHTITAN_TEST_IO_ERROR           before_data_file  "<ERRNO name>:<step>[:<rank>]": the first write of each
                                                         checkpoint data file fails with that OSError (EIO, ENOSPC)
    TORCHTITAN_TEST_SAVE_SECONDS       before_data_file  s: each checkpoint data file waits s seconds (slow storage)
    TORCHTITAN_TEST_NAN_STEP           nan_loss          n: the trainer's loss is NaN at step n
    TORCHTITAN_TEST_STALL_AT_STEP      hook_stall        n: sleep in step n ...
    TORCHTITAN_TEST_STALL_SECONDS      hook_stall        ... for s seconds (default: forever)
    TORCHTITAN_TEST_NEVER_JOIN         never_join        1: the rank never reaches the rendezvous
    TORCHTITAN_TEST_SLOW_DATA_SECONDS  slow_data         s: every batch takes s seconds longer (a straggler)
    TORCHTITAN_TEST_OOM_AT_STEP        oom_at            n: a CUDA out-of-memory error at the end of step n
    TORCHTITAN_TEST_RANK               (rank filter)     r: hook_stall, never_join, slow_data, oom_at act on rank r
    TORCHTITAN_TEST_SYNC_DEBUG         forbid_syncs      1 (CUDA): a host-device sync outside check steps raises
    TORCHTITAN_TEST_OOM_ABOVE          oom_above         n: generating a batch of more than n prompts raises OOM

Each function is cheap when its variable is unset (one dictionary lookup), so the calls stay in the hot loop.
"""

from __future__ import annotations

import errno
import os
import signal
import time

import torch

from torchtitan.log import logger

VARIABLES = (
    "TORCHTITAN_TEST_FAULT",
    "TORCHTITAN_TEST_IO_ERROR",
    "TORCHTITAN_TEST_SAVE_SECONDS",
    "TORCHTITAN_TEST_NAN_STEP",
    "TORCHTITAN_TEST_STALL_AT_STEP",
    "TORCHTITAN_TEST_STALL_SECONDS",
    "TORCHTITAN_TEST_NEVER_JOIN",
    "TORCHTITAN_TEST_SLOW_DATA_SECONDS",
    "TORCHTITAN_TEST_OOM_AT_STEP",
    "TORCHTITAN_TEST_RANK",
    "TORCHTITAN_TEST_SYNC_DEBUG",
    "TORCHTITAN_TEST_OOM_ABOVE",
)

# Read by the tests' own harness, never by the package: tests/dist/train_instrumented.py writes its counters there.
HARNESS_VARIABLES = ("TORCHTITAN_TEST_REPORT",)

# Where kill_at is called: after a training step, and inside a checkpoint save (in the order a save passes them).
KILL_POINTS = (
    "step_end",  # after a training step (the trainer first waits for its async save: the test knows what committed)
    "save_begin",  # a save starts, nothing written yet
    "save_data",  # before the first byte of each of this rank's data files (in the writing thread)
    "save_written",  # every rank's data on disk, no marker yet (rank 0)
    "save_marked",  # marker written, folder not yet renamed to step-N (rank 0)
)


def _get(name: str) -> str | None:
    assert name in VARIABLES, name  # a new variable goes into VARIABLES, the docstring and docs/testing.md
    return os.environ.get(name) or None


def _int(name: str) -> int | None:
    value = _get(name)
    return int(value) if value else None


def _applies(rank: int) -> bool:
    """TORCHTITAN_TEST_RANK, when set, limits a hook to that rank."""
    only = _int("TORCHTITAN_TEST_RANK")
    return only is None or only == rank


def _spec(name: str, step: int, rank: int) -> str | None:
    """For specs "<what>:<step>[:<rank>]": <what> when the step (and the rank, if given) match, else None."""
    spec = _get(name)
    if not spec:
        return None
    parts = spec.split(":")
    if int(parts[1]) != step or (len(parts) > 2 and int(parts[2]) != rank):
        return None
    return parts[0]


# ---------------------------------------------------------------------------------------------- checkpoints


def kill_at(point: str, step: int, rank: int, before=None) -> None:
    """TORCHTITAN_TEST_FAULT="<point>:<step>[:<rank>]": SIGKILL this process at `point` of `step`.

    Only on the first attempt under torchrun (TORCHELASTIC_RESTART_COUNT 0), so a restarted job runs through.
    `before` runs first (the trainer waits for its async save there)."""
    assert point in KILL_POINTS, point
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    if _spec("TORCHTITAN_TEST_FAULT", step, rank) == point:
        if before is not None:
            before()
        os.kill(os.getpid(), signal.SIGKILL)


def before_data_file(step: int, rank: int, path: str) -> None:
    """Before the first byte of checkpoint data file `path` of `step` (in the writing thread): slow storage
    (TORCHTITAN_TEST_SAVE_SECONDS), an injected OSError (TORCHTITAN_TEST_IO_ERROR), or the "save_data" kill."""
    seconds = float(_get("TORCHTITAN_TEST_SAVE_SECONDS") or 0)
    if seconds > 0:
        time.sleep(seconds)
    name = _spec("TORCHTITAN_TEST_IO_ERROR", step, rank)
    if name is not None:
        code = getattr(errno, name)
        raise OSError(code, os.strerror(code), path)
    kill_at("save_data", step, rank)


# ---------------------------------------------------------------------------------------------- training loop


def nan_step() -> int:
    """TORCHTITAN_TEST_NAN_STEP=<n>: the step whose loss the trainer makes NaN (0: none)."""
    return _int("TORCHTITAN_TEST_NAN_STEP") or 0


def nan_loss(step: int, loss):
    """The loss as the trainer should see it in `step`: NaN in the step TORCHTITAN_TEST_NAN_STEP names."""
    return loss * float("nan") if step == nan_step() else loss


def hook_stall(step: int, rank: int) -> None:
    """TORCHTITAN_TEST_STALL_AT_STEP=n: sleep in step n (TORCHTITAN_TEST_STALL_SECONDS, default forever).

    Its name is the frame tests/test_launch.py looks for in the watchdog's stack dump."""
    if _int("TORCHTITAN_TEST_STALL_AT_STEP") == step and _applies(rank):
        seconds = float(_get("TORCHTITAN_TEST_STALL_SECONDS") or 10**6)
        logger.warning("test hook: rank %d stalls in step %d for %.0f s", rank, step, seconds)
        end = time.monotonic() + seconds
        while time.monotonic() < end:  # short sleeps: a signal handler (preemption) can run in between
            time.sleep(min(1.0, end - time.monotonic()))


def never_join(rank: int) -> None:
    """TORCHTITAN_TEST_NEVER_JOIN=1: this rank never reaches the rendezvous."""
    if _get("TORCHTITAN_TEST_NEVER_JOIN") == "1" and _applies(rank):
        logger.warning("test hook: rank %d will never join", rank)
        time.sleep(10**6)


def slow_data(batches, rank: int):
    """TORCHTITAN_TEST_SLOW_DATA_SECONDS=s: every batch this rank fetches takes s seconds longer (a straggler, for
    the straggler report's test). Returns `batches` itself otherwise."""
    seconds = float(_get("TORCHTITAN_TEST_SLOW_DATA_SECONDS") or 0)
    if seconds <= 0 or not _applies(rank):
        return batches
    logger.warning("test hook: rank %d fetches every batch %.2f s slower", rank, seconds)

    def slow():
        for batch in batches:
            time.sleep(seconds)
            yield batch

    return slow()


def oom_at(step: int, rank: int) -> None:
    """TORCHTITAN_TEST_OOM_AT_STEP=n: an out-of-memory error at the end of step n, so the OOM handler runs on a
    machine without a GPU."""
    if _int("TORCHTITAN_TEST_OOM_AT_STEP") == step and _applies(rank):
        raise torch.cuda.OutOfMemoryError(
            f"CUDA out of memory (test hook TORCHTITAN_TEST_OOM_AT_STEP={step}). Tried to allocate 2.00 GiB"
        )


def forbid_syncs(forbid: bool, device: torch.device) -> None:
    """TORCHTITAN_TEST_SYNC_DEBUG=1 (CUDA only): any host-device sync while `forbid` raises an error."""
    if device.type == "cuda" and _get("TORCHTITAN_TEST_SYNC_DEBUG") == "1":
        torch.cuda.set_sync_debug_mode("error" if forbid else "default")


# ---------------------------------------------------------------------------------------------- generation


def oom_above(batch_size: int) -> None:
    """TORCHTITAN_TEST_OOM_ABOVE=n: a batch of more than n prompts fails with an out-of-memory error."""
    limit = _int("TORCHTITAN_TEST_OOM_ABOVE")
    if limit is not None and batch_size > limit:
        raise torch.OutOfMemoryError(
            f"simulated out of memory for a batch of {batch_size} (TORCHTITAN_TEST_OOM_ABOVE={limit})"
        )
