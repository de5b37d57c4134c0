"""A save that fails (full disk, I/O error, read-only folder; sync or async) as one line every rank raises.

Each rank keeps its own account of a failure (`save_failure`); the manager gathers them, rank 0 removes the
partial folder and words the message (`failure_message`: what failed, free space, the last good checkpoint and
what to do), and every rank raises it as a UserError (exit code 2). Older checkpoints are never touched.
"""

from __future__ import annotations

import os
import shutil

from torch.distributed.checkpoint.api import CheckpointException

from torchtitan.checkpoint.checksums import ChecksumWriter
from torchtitan.checkpoint.folder import last_good
from torchtitan.disk import free_text

_NO_SPACE = {28, 122}  # ENOSPC, EDQUOT
_NOT_WRITABLE = {1, 13, 30}  # EPERM, EACCES, EROFS


def _os_error(e: BaseException | None) -> OSError | None:
    """The OSError behind a failed save: in DCP's per-rank failures or the exception chain."""
    todo, seen = [e], set()
    while todo:
        x = todo.pop(0)
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, OSError):
            return x
        if isinstance(x, CheckpointException):
            todo += [f[0] if isinstance(f, tuple) else f for f in x.failures.values()]
        todo += [x.__cause__, x.__context__]
    return None


def save_failure(step: int, tmp: str, e: BaseException, writer: ChecksumWriter | None = None) -> tuple:
    """(step, tmp, what failed, errno, preference): an OSError's account (0) is preferred to another (1)."""
    err = (writer.error if writer is not None else None) or _os_error(e)
    if err is not None:
        where = f" ({err.filename})" if err.filename else ""
        return step, tmp, f"{err.strerror or err}{where}", err.errno or 0, 0
    lines = str(e).strip().splitlines()
    return step, tmp, f"{type(e).__name__}: {lines[0] if lines else ''}"[:300], 0, 1


def failure_message(folder: str, step: int, tmp: str, what: str, err: int) -> str:
    """Rank 0: remove the partial folder `tmp` and say what failed, the free space, the last good checkpoint in
    `folder` and what to do."""
    removed = ""
    if os.path.exists(tmp):
        shutil.rmtree(tmp, ignore_errors=True)
        removed = "; partial folder " + ("could not be removed" if os.path.exists(tmp) else "removed")
    last = last_good(folder)
    if err in _NO_SPACE:
        fix = f"free space at {folder} (or lower checkpoint.keep_latest_k)"
    elif err in _NOT_WRITABLE:
        fix = f"make {folder} writable"
    else:
        fix = f"check the storage of {folder}"
    then = f"rerun to resume from step {last[0]}" if last else "rerun (no checkpoint to resume from yet)"
    last_text = f"{last[1]} (step {last[0]})" if last else "none"
    return (
        f"checkpoint step-{step} could not be saved: {what}; {free_text(folder)} at {folder};"
        f" last good checkpoint: {last_text}{removed}; {fix}, then {then}"
    )
