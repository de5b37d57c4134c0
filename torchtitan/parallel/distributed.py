"""Process-group setup: backend from the device, timeouts from [comm], one process works without torchrun."""

from __future__ import annotations

import datetime
import itertools
import os
import socket
import sys
import time

import torch
import torch.distributed as dist

from torchtitan.errors import UserError
from torchtitan.testing import faults


def pick_device() -> torch.device:
    """This process's device: the local GPU under torchrun when CUDA is present, else the CPU."""
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        if local_rank >= torch.cuda.device_count():
            raise UserError(
                f"local rank {local_rank} has no GPU: this node sees {torch.cuda.device_count()} CUDA device(s)"
                f" (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); start torchrun"
                " with --nproc_per_node at most that many"
            )
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def launch_world() -> tuple[int, int]:
    """(world size, node count) the launcher set up, from torchrun's environment; (1, 1) without a launcher."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    if "GROUP_WORLD_SIZE" in os.environ:  # torchrun: the number of agents, i.e. nodes
        return world, int(os.environ["GROUP_WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return world, max(world // max(local, 1), 1)


def check_node_count(expected_nodes: int | None) -> None:
    """Fail before any communication when the launcher's world is not the one the config asks for.

    The classic failure: `torchrun --standalone` (or --nnodes 1) on each of N nodes forms N separate one-node
    worlds that all train happily on the same data.
    """
    world, nodes = launch_world()
    if expected_nodes is not None and nodes != expected_nodes:
        raise UserError(
            f"job.expected_nodes is {expected_nodes} but the launcher formed a world of {nodes} node(s)"
            f" ({world} processes); start torchrun with --nnodes {expected_nodes} and one shared"
            " --rdzv_endpoint/--rdzv_id on every node"
        )


def _wait_for_all_ranks(store, rank: int, world_size: int, timeout_s: float) -> None:
    """Every rank checks in at the store; on timeout name the ranks that never did (the hung or dead ones)."""
    prefix = "torchtitan/join"  # the store is already per restart attempt
    store.set(f"{prefix}/{rank}", socket.gethostname())
    store.add(f"{prefix}/count", 1)
    deadline = time.monotonic() + timeout_s
    # Thousands of ranks polling one store: poll slower. A small world starts at 10 ms and backs off to the same
    # cap, so its ranks do not wait half a second after the last one has joined.
    cap = min(5.0, 0.5 + world_size / 1000)
    delay = 0.01 if world_size <= 64 else cap
    while store.add(f"{prefix}/count", 0) < world_size:  # one counter read per poll, not world_size key reads
        if time.monotonic() > deadline:
            missing = [r for r in range(world_size) if not store.check([f"{prefix}/{r}"])]
            from torchtitan.watchdog import die

            die(
                f"rank {rank}: rank(s) {_ranges(missing)} of {world_size} did not join within {timeout_s:.0f} s"
                f" (comm.init_timeout_seconds); check those ranks' logs and nodes"
            )
        time.sleep(delay)
        delay = min(cap, 2 * delay)


def _ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5': a world of thousands stays one line."""
    out, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(out)


_GROUPS = itertools.count()  # default process groups this process has created


def init_distributed(device: torch.device, init_timeout_seconds: int) -> tuple[int, int]:
    """Initialize the default process group and return (rank, world_size).

    Under torchrun the env:// rendezvous is used. Without it (`python train.py`), a one-process group on an
    in-memory store is created, so the same code path (FSDP2 on a 1-rank mesh) runs everywhere.
    CUDA ranks get NCCL for GPU tensors and gloo for CPU tensors; CPU ranks get gloo.
    Every stage (joining, first collective) is bounded by the init timeout and names the ranks that are missing.
    """
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    backend = "cuda:nccl,cpu:gloo" if device.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=init_timeout_seconds)
    if "WORLD_SIZE" not in os.environ:
        dist.init_process_group(
            backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout
        )
        return 0, 1
    faults.never_join(int(os.environ["RANK"]))
    store, rank, world_size = next(dist.rendezvous("env://", timeout=timeout))
    store.set_timeout(timeout)
    # torchrun --max-restarts keeps one store across attempts: prefix the keys with the attempt, or a restarted
    # group reads the dead attempt's addresses (found by the checkpoint work).
    # A process that trains more than once (tests/dist/train_many.py) starts each group on fresh keys too.
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.PrefixStore(f"/attempt_{attempt}/group_{next(_GROUPS)}", store)
    _wait_for_all_ranks(store, rank, world_size, init_timeout_seconds)
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(
        backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout, **kwargs
    )
    # The first collective, also under the init timeout. gloo's monitored_barrier names the ranks that do not
    # arrive; NCCL has no such barrier, so a GPU all-reduce (which also creates the communicator) stands in.
    if device.type == "cpu":
        try:
            dist.monitored_barrier(timeout=timeout, wait_all_ranks=True)
        except RuntimeError as e:
            from torchtitan.watchdog import die

            die(
                f"rank {rank}: first collective timed out after {init_timeout_seconds} s: {str(e).splitlines()[0]}"
            )
    else:
        dist.all_reduce(torch.ones(1, device=device))
    return rank, world_size


def set_collective_timeout(seconds: int) -> None:
    """Give every process group this process belongs to the timeout `seconds`.

    That is the default group, every device-mesh group (dp, fsdp, tp, pp, cp and their flattened views: torch
    creates them with its own 10 min NCCL / 30 min gloo default, not the default group's timeout) and any other
    group created so far (the checkpoint's async gloo group). The trainer applies the init timeout before the first
    step and the training timeout after it. A group's timeout bounds each collective issued after the change.
    """
    # _set_pg_timeout is the only way torch offers to change a live group's timeout (torch >= 2.3); _world.pg_map
    # holds every group this process created and is a member of.
    from torch.distributed.distributed_c10d import _rank_not_in_group, _set_pg_timeout, _world

    if dist.get_backend() == "fake":  # the fake-backend simulation (simulate.py): nothing ever waits
        return
    timeout = datetime.timedelta(seconds=seconds)
    for group in list(_world.pg_map):
        if not _rank_not_in_group(group):
            _set_pg_timeout(timeout, group)


def exit_process(code: int) -> None:
    """Exit with `code` without the interpreter's final teardown.

    Called by the entry points after main() returned, i.e. after the ranks' last barrier and
    destroy_process_group. Even then a gloo run sometimes lost a process to SIGABRT at interpreter exit ("terminate
    called without an active exception": a C++ thread destroyed unjoined), turning a finished run's exit 0 into
    -6: seen in 2-process TP and FSDP runs of the trainer, scripts/generate.py and scripts/perplexity.py on a loaded
    machine, and (2026-11-25, a clean-clone suite) in a one-process resume after "training finished". Everything
    the run writes is closed by then (metrics, TensorBoard, W&B, checkpoints); what the interpreter would still run
    at exit -- the atexit handlers (logging's shutdown, coverage's data file under pytest-cov) -- runs here, and
    only the destruction of C++ statics, where the abort happens, is skipped."""
    import atexit

    atexit._run_exitfuncs()  # CPython's own exit sequence: every registered handler, in reverse order
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if code is None else code)  # sys.exit's meaning of None
