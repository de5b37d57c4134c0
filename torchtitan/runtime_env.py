"""Environment variables the trainer sets for NCCL and cuBLAS before they start, only where the user has not; and,
on CPU, glibc malloc's two settings that make freed tensor memory reusable (below).

Each is read once, when the library starts (NCCL: when a process group is created; cuBLAS: at its first handle),
so `set_env_defaults` runs at the top of the trainer. A variable already in the environment is left alone,
whatever its value. docs/launching.md explains each choice and what a user sees when a collective fails.
"""

from __future__ import annotations

import ctypes
import os

import torch
from torch.torch_version import TorchVersion

from torchtitan.simulate import enabled as simulating

# NCCL on a timed-out or failed collective (values of TORCH_NCCL_ASYNC_ERROR_HANDLING in torch's
# ProcessGroupNCCL.hpp: 0 no handling, 1 abort communicators and tear down the process, 2 only abort the
# communicators, 3 tear down without aborting; torch's default is 3). With 2 the process lives on and the
# training thread's next use of the aborted communicator raises DistBackendError ("NCCL communicator was aborted
# on rank R. ... Watchdog caught collective operation timeout ..."), which the trainer turns into its one-line
# "rank R: collective failed in step S" message and exit code 3, like a gloo timeout. TORCH_NCCL_BLOCKING_WAIT is
# deliberately NOT set: it makes every wait() block the host until the collective finishes, i.e. a host-device
# sync per collective.
NCCL_ERROR_HANDLING = "2"
FLIGHT_RECORDER_EVENTS = "2000"  # collectives remembered per process group for the dump
CUBLAS_DETERMINISTIC = ":4096:8"  # the workspace setting cuBLAS documents for reproducible results
# torch >= 2.11 reads the flight recorder's TORCH_FR_* names and warns that the TORCH_NCCL_* ones are deprecated;
# older releases get both spellings.
_TORCH_READS_FR_NAMES = TorchVersion(torch.__version__) >= "2.11"

# CPU tensors come from glibc malloc. It serves a block above its mmap threshold (at most 32 MiB) with a fresh mmap
# and unmaps it on free, and it returns the free top of the heap to the OS above its trim threshold: every
# step's weight casts, gradients and optimizer temporaries are then new pages, each zero-filled by the kernel on
# first touch (measured on a 2-core VM: writing 4 GiB of fresh pages takes 1.7-2.5 s, of reused ones 0.25 s).
# mallopt(M_MMAP_MAX, 0) serves every block from the heap and M_TRIM_THRESHOLD = INT_MAX keeps what was freed
# (up to 2 GiB of free top), so from step 2 on a step reuses the memory of the one before, as the CUDA caching
# allocator does. Constants from glibc's malloc.h; the GLIBC_TUNABLES names are what the run header prints.
# Below glibc's largest mmap threshold (32 MiB on 64-bit) its dynamic threshold already keeps blocks in the heap,
# so the settings are applied only to models with a weight matrix at least that large (the debug model's largest
# is 2 MiB; there they measured within noise, 2 pairs each way).
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_TRIM_THRESHOLD = 2**31 - 1
MMAP_THRESHOLD_MAX = 32 * 2**20
_MALLOC_USER_SETTINGS = (
    "GLIBC_TUNABLES",
    "MALLOC_MMAP_MAX_",
    "MALLOC_MMAP_THRESHOLD_",  # also how the estimator's CPU probe maps every tensor (estimate/calibrate.py)
    "MALLOC_TRIM_THRESHOLD_",
    "LD_PRELOAD",
)


def _keep_freed_cpu_memory() -> dict[str, str]:
    """Apply the two malloc settings above, unless the user tuned malloc or preloads another allocator (jemalloc,
    tcmalloc), or the C library is not glibc. Returns what was set."""
    if any(name in os.environ for name in _MALLOC_USER_SETTINGS):
        return {}
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return {}
    if mallopt(_M_MMAP_MAX, 0) != 1 or mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD) != 1:
        return {}
    return {"glibc.malloc.mmap_max": "0", "glibc.malloc.trim_threshold": str(_TRIM_THRESHOLD)}


def set_env_defaults(cfg, device_type: str, largest_weight_bytes: int = 0) -> dict[str, str]:
    """Set the defaults below that are not set yet; returns what was set (for the run header).

    CUDA: NCCL error handling (above), a flight-recorder dump on timeout into <dump_folder>/logs/nccl_trace_rank<R>
    (torch >= 2.11 reads TORCH_FR_* and gets only those; older releases also get the TORCH_NCCL_* spellings).
    training.deterministic: CUBLAS_WORKSPACE_CONFIG, without which deterministic cuBLAS matmuls raise an error.
    CPU, when the largest weight is at least MMAP_THRESHOLD_MAX bytes: glibc malloc keeps freed memory for reuse
    (`_keep_freed_cpu_memory`; a process setting, not a variable).
    """
    wanted: list[tuple[tuple[str, ...], str]] = []
    if device_type == "cuda":
        trace = os.path.abspath(os.path.join(cfg.job.dump_folder, "logs", "nccl_trace_rank"))
        os.makedirs(os.path.dirname(trace), exist_ok=True)
        wanted += [
            (("TORCH_NCCL_ASYNC_ERROR_HANDLING",), NCCL_ERROR_HANDLING),
            (("TORCH_NCCL_DUMP_ON_TIMEOUT",), "1"),
            (("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"), FLIGHT_RECORDER_EVENTS),
            (("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"), trace),
        ]
    if cfg.training.deterministic:
        wanted.append((("CUBLAS_WORKSPACE_CONFIG",), CUBLAS_DETERMINISTIC))
    done = {}
    for names, value in wanted:
        # a setting the user made under any of its names is kept; torch >= 2.11 warns when it sees an old name
        if not any(name in os.environ for name in names):
            for name in names[:1] if _TORCH_READS_FR_NAMES else names:
                os.environ[name] = value
                done[name] = value
    # Not for a simulated rank (comm.mode=fake_backend): its FSDP buffers are whole unsharded blocks of a large
    # model, of many sizes, and a heap that never returns them fragments until the process is killed (a 70B rank
    # of 256 reached 24 GiB this way; 7.3 GiB with glibc's own mmap of large blocks).
    if device_type == "cpu" and largest_weight_bytes >= MMAP_THRESHOLD_MAX and not simulating(cfg):
        done.update(_keep_freed_cpu_memory())
    return done
