"""Turn hangs into loud exits: a step watchdog and the one-line timeout message.

A distributed job that hangs costs its whole allocation until someone notices. Every rank runs a watchdog thread:
when no training step has completed for `comm.watchdog_timeout_seconds`, it writes every thread's Python stack to
the rank's log (faulthandler works even while the main thread is blocked in C++), on CUDA also the NCCL flight
recorder, and ends the process with HANG_EXIT_CODE. Every rank stuck in the same hang dumps its own stacks, so
the log folder shows which rank waits where.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
import threading
import time

from torchtitan.log import logger

HANG_EXIT_CODE = 3  # watchdog fired, or a rendezvous / collective timed out (documented in docs/launching.md)


def die(message: str, code: int = HANG_EXIT_CODE, exc: BaseException | None = None) -> None:
    """Log one line (with `exc`'s traceback in the log, for the record), flush every handler and leave at once.

    os._exit, not sys.exit: after a timeout the process group is unusable and destroying it (or other threads'
    atexit work) can block forever, which is exactly what we are escaping.
    """
    logger.error(message, exc_info=exc)
    # one write (stderr flushes at the newline), so that no other rank's line lands inside this one
    sys.stderr.write(f"error: {message}\n")
    for h in logger.handlers:
        h.flush()
    sys.stdout.flush()
    os._exit(code)


def is_comm_failure(e: BaseException) -> bool:
    """A collective that timed out or lost a peer (gloo and NCCL raise RuntimeError subclasses for both)."""
    import torch.distributed as dist

    text = str(e).lower()
    return isinstance(e, dist.DistError) or any(
        w in text for w in ("timed out", "timeout", "connection closed", "connection reset", "gloo", "nccl")
    )


# The last step any Watchdog saw complete on this rank (None before training starts), for failure messages.
_last_step: int | None = None


def last_completed_step() -> int | None:
    """The last training step this rank completed (None before training starts): for failure messages."""
    return _last_step


def comm_failure_message(e: BaseException) -> str:
    """One line for a failed collective: this rank, the step it was in, the last completed step, the error."""
    rank = os.environ.get("RANK", "0")
    where = (
        "during initialization"
        if _last_step is None
        else f"in step {_last_step + 1} (last completed step {_last_step})"
    )
    return f"rank {rank}: collective failed {where}: {first_line(e)}"


def first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


def _log_file() -> str | None:
    for h in logger.handlers:
        if isinstance(h, logging.FileHandler):
            return h.baseFilename
    return None


def dump_stacks(reason: str) -> None:
    """Every thread's Python stack to stderr and to the rank's log file; the NCCL flight recorder on CUDA."""
    logger.error(reason)
    for h in logger.handlers:
        h.flush()
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    path = _log_file()
    if path:
        with open(path, "a") as f:
            f.write(f"---- Python stacks of all threads ({reason}) ----\n")
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
    _dump_nccl_flight_recorder(os.path.dirname(path) if path else ".")


def _dump_nccl_flight_recorder(folder: str) -> None:
    """NCCL's record of recent collectives per rank (GPU only; needs TORCH_NCCL_TRACE_BUFFER_SIZE > 0)."""
    import torch

    if not torch.cuda.is_available():
        return
    try:
        from torch._C._distributed_c10d import (
            _dump_nccl_trace,
        )  # private; present in torch >= 2.3 CUDA builds
    except ImportError:
        logger.warning("NCCL flight recorder not available in this torch build")
        return
    rank = os.environ.get("RANK", "0")
    # the file NCCL's own dump on a collective timeout writes too (torchtitan/runtime_env.py sets the prefix)
    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE") or os.path.join(folder, "nccl_trace_rank")
    path = f"{prefix}{rank}"
    try:
        with open(path, "wb") as f:
            f.write(_dump_nccl_trace())
        logger.error("NCCL flight recorder written to %s (read it with torch's fr_trace tool)", path)
    except Exception as e:  # an empty buffer or a dead communicator must not stop the exit
        logger.warning("NCCL flight recorder dump failed: %s", e)


class Watchdog:
    """`beat(step)` after every completed step; if none comes within the timeout, dump stacks and exit."""

    def __init__(self, timeout_s: float, first_step_grace_s: float = 0.0, rank: int = 0):
        self.timeout_s, self.rank = timeout_s, rank
        self.last_step = 0
        # The first step also pays for warm-up (compile, allocator growth, first checkpoint load): allow more.
        self._deadline = time.monotonic() + timeout_s + first_step_grace_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        global _last_step
        _last_step = 0  # training starts: failures from here on are "in step N"
        self._thread = threading.Thread(target=self._run, name="torchtitan-watchdog", daemon=True)
        if timeout_s > 0:
            self._thread.start()

    def beat(self, step: int) -> None:
        global _last_step
        _last_step = step
        with self._lock:
            self.last_step = step
            self._deadline = time.monotonic() + self.timeout_s

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(min(5.0, max(self.timeout_s / 10, 0.1))):
            with self._lock:
                late = time.monotonic() > self._deadline
                last = self.last_step
            if late:
                dump_stacks(
                    f"watchdog: rank {self.rank}: no training step completed in {self.timeout_s:.0f} s "
                    f"(last completed step {last}); stacks of all threads follow"
                )
                # Wait a little before exiting: the launcher kills every rank once one exits, and the other
                # ranks' watchdogs (their last step ended at about the same time) need a moment to dump too.
                time.sleep(min(30.0, self.timeout_s))
                die(
                    f"watchdog: rank {self.rank} hung after step {last} (no step for {self.timeout_s:.0f} s, "
                    f"comm.watchdog_timeout_seconds); stacks are in the rank logs"
                )
