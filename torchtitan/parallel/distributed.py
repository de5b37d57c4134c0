"""Process-group setup: backend from the device, timeouts from [comm], one process works without torchrun."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist


def pick_device() -> torch.device:
    """This process's device: the local GPU under torchrun when CUDA is present, else the CPU."""
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_distributed(device: torch.device, init_timeout_seconds: int) -> tuple[int, int]:
    """Initialize the default process group and return (rank, world_size).

    Under torchrun the env:// rendezvous is used. Without it (`python train.py`), a one-process group on an
    in-memory store is created, so the same code path (FSDP2 on a 1-rank mesh) runs everywhere.
    CUDA ranks get NCCL for GPU tensors and gloo for CPU tensors; CPU ranks get gloo.
    """
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    backend = "cuda:nccl,cpu:gloo" if device.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=init_timeout_seconds)
    if "WORLD_SIZE" in os.environ:
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        if "TORCHELASTIC_RESTART_COUNT" in os.environ:
            kwargs.update(_attempt_store(timeout))
        dist.init_process_group(backend=backend, timeout=timeout, **kwargs)
    else:
        dist.init_process_group(
            backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout
        )
    return dist.get_rank(), dist.get_world_size()


def _attempt_store(timeout: datetime.timedelta) -> dict:
    """Under torchrun, the rendezvous store with keys prefixed by the restart attempt.

    torchrun --max-restarts keeps one TCPStore across attempts. In torch 2.13 the workers' keys are not separated
    per attempt, so a restarted gloo group reads the dead attempt's addresses and fails ("connectFullMesh ...
    Connection refused"). A per-attempt prefix makes every attempt rendezvous from scratch.
    """
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # else rank 0 hosts the store
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world,
        is_master=rank == 0 and not agent_store,
        timeout=timeout,
    )
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    return {"store": dist.PrefixStore(f"/attempt_{attempt}", store), "rank": rank, "world_size": world}


def set_collective_timeout(seconds: int) -> None:
    """Switch the default group from the init timeout to the (usually shorter) training-step timeout."""
    # _set_pg_timeout is the only way torch offers to change a live group's timeout (torch >= 2.3).
    from torch.distributed.distributed_c10d import _set_pg_timeout

    _set_pg_timeout(datetime.timedelta(seconds=seconds))
