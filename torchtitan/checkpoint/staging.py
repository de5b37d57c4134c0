"""Asynchronous saves: the stager that copies the state off the device, and the record of a save in flight.

An async save (checkpoint.async_mode = "async") blocks the loop only while the state is staged (copied to host
memory); DCP writes it in a background thread, and the manager commits it when it has finished
(docs/checkpointing.md, "Async save"). One stager serves all saves of a run, so the staging copy is allocated once: that needs a torch
whose DefaultStager can stage more than once, which `stager_survives_reuse` probes.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from torchtitan.checkpoint.checksums import ChecksumWriter


@dataclasses.dataclass
class PendingSave:
    """An async save in flight."""

    future: object
    writer: ChecksumWriter
    tmp: str
    final: str
    marker: dict
    step: int
    t0: float
    done_at: list


def _default_stager():
    """A DefaultStager (torch >= 2.9; None before, where dcp.async_save stages as it always did): its staging copy
    is kept from save to save instead of being allocated at every save (DCP's default); on CUDA the copy is
    pinned memory and the device-to-host copies are non-blocking."""
    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    except ImportError:  # pragma: no cover - torch < 2.9
        return None
    cuda = torch.cuda.is_available()
    # Positional: the fourth field was `use_cuda_non_blocking_copy` before torch renamed it `use_non_blocking_copy`
    # (pytorch#158337); the order (pinned, shared, async staging, non-blocking copy) is the same in both.
    return DefaultStager(
        StagingOptions(
            cuda,  # pinned host memory for the staging copy
            False,  # no shared memory (the writer is a thread of this process)
            False,  # synchronous staging: the loop waits for the copy (as before); the write runs in the background
            cuda,  # non-blocking device-to-host copies, synchronized before stage() returns
        )
    )


@functools.cache
def stager_survives_reuse() -> bool:
    """Whether one DefaultStager can stage more than once. torch 2.11 closes it at the end of every stage(), so a
    second save fails with `KeyError: <class 'type'>` (pytorch#183413); probed once on a tiny CPU tensor."""
    stager = _default_stager()
    if stager is None:
        return False
    try:
        for _ in range(2):
            stager.stage({"x": torch.zeros(1)})
        return True
    except KeyError:
        return False
    finally:
        stager.close()


def build_stager():
    """The async stager of a run, one for all its saves, so the staging copy is allocated once.

    A DefaultStager where torch can reuse one. Where it cannot (torch 2.11), on CUDA: torch's BlockingAsyncStager
    with its cache, which pins one host copy at the first save and copies into it at every later one (the same
    effect; its copies are blocking, which the loop waited for anyway). Without CUDA that cache cannot be used
    (it is always pinned), so the DefaultStager stays and `stager_for_save` replaces it at every save."""
    if stager_survives_reuse() or not torch.cuda.is_available():
        return _default_stager()
    from torch.distributed.checkpoint.staging import BlockingAsyncStager

    return BlockingAsyncStager(cache_staged_state_dict=True)


def stager_for_save(current):
    """The stager for the next async save: the run's own, except a DefaultStager that torch cannot reuse, which
    is replaced by a fresh one (staging memory then allocated at every save, as DCP's default does)."""
    if current is None or stager_survives_reuse():
        return current
    from torch.distributed.checkpoint.staging import DefaultStager

    return _default_stager() if isinstance(current, DefaultStager) else current
