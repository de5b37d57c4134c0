"""Starting fast and never stalling: no host-device sync outside check steps, no random init when loading, the
RoPE table on the compute device under CPU offload, environment defaults for NCCL/cuBLAS, eager optimizer state.
(Timeouts on every process group: tests/test_launch.py. Layout-independent init: tests/test_init_layout.py.)
"""

from __future__ import annotations

import functools
import json
import os
import platform
import re
import shutil

import pytest
import torch
from torch.torch_version import TorchVersion

from conftest import TINY, run_script, run_train, train_env
from torchtitan.config import parse_args
from torchtitan.models import get_model_class, model_args_from_config
from torchtitan.parallel import ParallelDims, fsdp, init_distributed, local_coords, materialize, parallelize
from torchtitan.runtime_env import set_env_defaults

ARGS = TINY + [
    "--training.steps=7",
    "--metrics.log_freq=3",
    "--metrics.peak_tflops=1",
    "--training.gc_freq=0",
]


def instrumented(folder, nproc, args, env=None):
    """Run tests/dist/train_instrumented.py with dump folder `folder`; returns (process, per-rank reports)."""
    folder.mkdir(parents=True, exist_ok=True)
    report = folder / "report.json"
    r = run_script(
        nproc,
        "tests/dist/train_instrumented.py",
        args + [f"--job.dump_folder={folder}"],
        env=train_env(TORCHTITAN_TEST_REPORT=str(report), **(env or {})),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    reports = [json.loads(report.read_text())]
    reports += [json.loads((folder / f"report.json.{rank}").read_text()) for rank in range(1, nproc)]
    for rep in reports:
        rep["reads_per_step"] = {int(k): v for k, v in rep["reads_per_step"].items()}
    return r, reports


@pytest.mark.parametrize("nproc", [1, 2])
def test_device_values_are_read_on_check_steps_only(tmp_path, nproc):
    """Every host read of a device value goes through host_sync.to_host; the loop calls it on log steps (1, 3, 6
    and the last, 7) and not at all on the others, and nothing before step 1 reads the device either."""
    _, reports = instrumented(tmp_path, nproc, ARGS)
    for rep in reports:
        reads = rep["reads_per_step"]
        assert sorted(reads) == list(range(8))
        assert reads[0] == 0  # startup
        assert [s for s in range(1, 8) if reads[s] == 0] == [2, 4, 5]  # non-log steps: no read at all
        assert all(reads[s] >= 1 for s in (1, 3, 6, 7))


def test_skip_nonfinite_steps_checks_every_step(tmp_path):
    """The opt-in per-step check: every step reads its flag (the documented cost)."""
    _, (rep,) = instrumented(tmp_path, 1, ARGS + ["--training.skip_nonfinite_steps=true"])
    assert all(rep["reads_per_step"][s] >= 1 for s in range(1, 8))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_no_sync_on_non_log_steps_on_cuda(tmp_path):
    """torch.cuda.set_sync_debug_mode("error") on every non-check step (test hook): any host-device sync there
    (an .item(), a .cpu(), a blocking copy) would raise and fail the run."""
    r, (rep,) = instrumented(tmp_path, 1, ARGS, env={"TORCHTITAN_TEST_SYNC_DEBUG": "1"})
    assert [s for s in range(1, 8) if rep["reads_per_step"][s] == 0] == [2, 4, 5]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_to_host_reads_values_from_different_devices():
    """Under FSDP CPU offload the gradient norm is a CPU tensor and the loss a GPU one: one read takes both."""
    from torchtitan.host_sync import to_host

    assert to_host(torch.tensor(1.5, device="cuda"), torch.tensor(2.0)) == [1.5, 2.0]
    assert to_host(torch.tensor(3.0), torch.tensor(0.25, device="cuda")) == [3.0, 0.25]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fsdp_cpu_offload_trains_on_cuda(tmp_path):
    """Parameters, gradients and optimizer state in CPU memory, compute on the GPU: the run finishes its log
    steps (before the fix, the first log step stacked the CPU gradient norm with the GPU loss and crashed)."""
    r = run_train(
        1,
        TINY + ["--training.steps=3", "--parallelism.fsdp_cpu_offload=true", f"--job.dump_folder={tmp_path}"],
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "loss/global_avg" in row][-1] == 3


def test_resume_draws_no_random_weights(tmp_path):
    """A fresh run initializes every random parameter; a run resuming from a checkpoint initializes none (the
    load overwrites them all) and still continues exactly (the RoPE table is computed either way)."""
    args = ARGS + [
        "--checkpoint.enable=true",
        "--checkpoint.interval=4",
        "--training.mixed_precision_param=float32",
    ]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    r, (fresh,) = instrumented(straight, 1, args)
    assert fresh["init_calls"] > 10 and "weights initialized in" in r.stdout + r.stderr
    shutil.copytree(straight / "checkpoint" / "step-4", resumed / "checkpoint" / "step-4")
    r, (rep,) = instrumented(resumed, 1, args)
    assert rep["init_calls"] == 0
    assert "weights loaded from" in r.stdout + r.stderr and "resumed from" in r.stdout + r.stderr
    assert losses(resumed)[7] == losses(straight)[7]  # bitwise: the resumed run continued exactly


def losses(folder) -> dict[int, float]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["loss/global_avg"] for row in rows}


def test_materialize_puts_rope_on_the_compute_device_under_cpu_offload(monkeypatch):
    """FSDP CPU offload keeps parameters in CPU memory, but the RoPE table is a buffer FSDP does not manage: it must
    be on the compute device, or the first forward mixes devices. "meta" stands in for the GPU here (and pinned
    memory, which needs a GPU, is off)."""
    monkeypatch.setattr(fsdp, "CPUOffloadPolicy", functools.partial(fsdp.CPUOffloadPolicy, pin_memory=False))
    init_distributed(torch.device("cpu"), 60)
    try:
        cfg = parse_args([*TINY, "--parallelism.fsdp_cpu_offload=true"])
        dims = ParallelDims.from_config(cfg.parallelism, 1)
        dims.build_mesh("cpu")
        with torch.device("meta"):
            model = get_model_class("llama3")(model_args_from_config(cfg.model, 64))
        parallelize(model, dims, cfg)
        materialize(model, torch.device("meta"), cpu_offload=True)
        assert {p.device.type for p in model.parameters()} == {"cpu"}
        assert model.freqs_cis.device.type == "meta"
        model.init_weights(0, local_coords=local_coords)
        assert model.freqs_cis.device.type == "meta"  # init keeps it where materialize put it
        materialize(model, torch.device("cpu"))  # without offload everything is on the device
        assert model.freqs_cis.device.type == "cpu" and not model.freqs_cis.isnan().any()
    finally:  # the default process group would leak into later tests of this pytest process
        torch.distributed.destroy_process_group()


def test_environment_defaults(tmp_path, monkeypatch):
    """NCCL error handling, the flight recorder dump into the run's log folder, and CUBLAS_WORKSPACE_CONFIG for
    deterministic runs: set when absent, and a user's own value (under either name) is kept."""
    # set_env_defaults writes os.environ directly: give it a copy, so nothing leaks into later tests' subprocesses
    monkeypatch.setattr(os, "environ", os.environ.copy())
    for name in (
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "TORCH_NCCL_DUMP_ON_TIMEOUT",
        "TORCH_FR_BUFFER_SIZE",
        "TORCH_NCCL_TRACE_BUFFER_SIZE",
        "TORCH_FR_DUMP_TEMP_FILE",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
        "CUBLAS_WORKSPACE_CONFIG",
    ):
        monkeypatch.delenv(name, raising=False)
    cfg = parse_args([f"--job.dump_folder={tmp_path}"])
    for name in (
        "GLIBC_TUNABLES", "MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "LD_PRELOAD"
    ):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    # gloo and no determinism: no variable; on glibc, malloc is told to keep freed memory
    kept = {"glibc.malloc.mmap_max": "0", "glibc.malloc.trim_threshold": str(2**31 - 1)}
    assert set_env_defaults(cfg, "cpu", 2 * 2**20) == {}  # small weights: glibc's dynamic threshold suffices
    one_b = model_args_from_config(parse_args(["--model.flavor=1B"]).model, 64).largest_weight_bytes()
    assert one_b == 4 * 2048 * 128256
    # a simulated rank (comm.mode=fake_backend) keeps glibc's behaviour: its heap would fragment (docs/estimate.md)
    sim = parse_args(
        [f"--job.dump_folder={tmp_path}", "--comm.mode=fake_backend", "--comm.fake_world_size=8"]
    )
    assert set_env_defaults(sim, "cpu", one_b) == {}
    assert set_env_defaults(cfg, "cpu", one_b) == (kept if platform.libc_ver()[0] == "glibc" else {})
    # every tensor its own mapping (the estimator's CPU probe, or a user): left alone, mmaps stay allowed
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert set_env_defaults(cfg, "cpu", one_b) == {}
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")  # the user tuned malloc: left alone
    assert set_env_defaults(cfg, "cpu", one_b) == {}
    cfg = parse_args([f"--job.dump_folder={tmp_path}", "--training.deterministic=true"])
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "77")  # the user's, under the older name
    done = set_env_defaults(cfg, "cuda")
    assert (
        os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2"
        and os.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    )
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    trace = str(tmp_path / "logs" / "nccl_trace_rank")
    assert os.environ["TORCH_FR_DUMP_TEMP_FILE"] == trace and done["TORCH_FR_DUMP_TEMP_FILE"] == trace
    # torch >= 2.11 warns about the older name: it gets only the new one; older torch gets both
    old_name_too = TorchVersion(torch.__version__) < "2.11"
    assert (os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") == trace) == old_name_too
    assert "TORCH_FR_BUFFER_SIZE" not in os.environ and os.environ["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "77"
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in done and done["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert set_env_defaults(cfg, "cuda") == {}  # everything is set now


def test_deterministic_run_sets_cublas_workspace_and_reports_startup(tmp_path):
    """The trainer applies the defaults before any library starts and says so in the run header, with the
    init and optimizer-state times."""
    r = run_train(
        1, TINY + ["--training.steps=1", "--training.deterministic=true", f"--job.dump_folder={tmp_path}"]
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    header = next(line for line in out.splitlines() if "environment defaults:" in line)
    assert "CUBLAS_WORKSPACE_CONFIG=:4096:8" in header.split()  # on CUDA after the NCCL settings
    assert "startup: weights initialized in" in out and "optimizer state allocated in" in out
    assert "first step done" in out and "collective timeout now 100 s" in out
    # both clocks: from train()'s start, and from the process's (interpreter and imports included: later)
    m = re.search(r"first step done ([\d.]+) s after start \(([\d.]+) s after the process started\)", out)
    assert m and float(m.group(2)) >= float(m.group(1)), out[-2000:]


def test_float8_token_count_is_one_line_exit_2_before_allocation(tmp_path):
    r = run_train(
        1,
        TINY
        + [
            "--float8.enable=true",
            "--training.local_batch_size=1",
            "--training.seq_len=40",
            f"--job.dump_folder={tmp_path}",
        ],
    )
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith(
        "error: float8: training.local_batch_size=1 x training.seq_len=40 = 40 tokens"
    )
    assert "Traceback" not in r.stderr
