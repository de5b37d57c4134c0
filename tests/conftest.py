"""Shared test helpers: run the trainer in 1..N processes exactly as a user would."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torchtitan import gc_policy

# Collecting imports torch, datasets and every test module: without the automatic GC passes over what they allocate,
# 1.8 CPU-s less per pytest process (7.8 -> 6.0 s); resumed before the first test (pytest_collection_finish).
gc_policy.pause()

# One intra-op thread in every pytest process and, through the environment, in every process a test starts (unless
# OMP_NUM_THREADS is already set). The suite runs three workers beside multi-rank runs on 2 cores: an in-process test
# with torch's default of one thread per core spins in OpenMP's barriers whenever its other thread is descheduled.
# Measured on a 2-core VM beside a 4-rank torchrun: the debug model's cached-greedy generation test 34 s with the
# default 2 threads, 1.5 s with 1 (docs/testing.md).
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

from torchtitan.launch import local_command  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# Small, fast settings for end-to-end runs of the debug model on a 2-core CPU.
TINY = [
    "--job.config_file=train_configs/debug_model.toml",
    "--training.local_batch_size=2",
    "--training.seq_len=64",
    "--metrics.log_freq=1",
    "--job.print_config=false",
]
# A fixed MFU peak, so the run skips the matmul calibration (0.5 s per process on CPU): for runs none of whose checks
# reads MFU. The calibration itself is checked by tests/test_train_e2e.py, tests/test_metrics_units.py, the README walk.
FIXED_PEAK = "--metrics.peak_tflops=1"


# The suite's longest files, roughly longest first (per-file times: docs/testing.md). scripts/test.sh runs whole files per
# pytest-xdist worker in collection order (--dist loadfile --no-loadscope-reorder), so the long files start at once
# and the short ones fill the end, instead of one long file starting last and running alone. Files not named here
# follow in their usual order; the order changes when tests run, never what they check.
LONGEST_FIRST = [
    "test_slurm.py",  # mostly waiting on SLURM (requeue): it overlaps the other worker's compute
    "test_parity_cp.py",  # the first of the three parity files to start trains all their runs (test_parity.parity_runs)
    "test_faults.py",
    "test_launch.py",
    "test_simulate.py",
    "test_checkpoint.py",
    "test_startup.py",
    "test_float8.py",
    "test_validation.py",
    "test_generate.py",
    "test_readme.py",
    "test_init_layout.py",
    "test_estimate.py",
    "test_parity_pp.py",  # its layouts come from test_parity_cp.py's start (above): its own runs take ~10 CPU-s
    "test_perplexity_hf.py",
    "test_train_e2e.py",
    "test_observability.py",
    "test_bench_peers.py",
    "test_torchtitan_compat.py",
    "test_gpu_scripts.py",
    "test_compile.py",
    "test_goodput.py",
    "test_checkpoint_hf.py",
    "test_parity.py",  # every run of it comes from test_parity_cp.py's start: late, so that it does not wait for them
]


def pytest_collection_modifyitems(config, items):
    """Order files longest first (LONGEST_FIRST; a stable sort keeps each file's own order). Mark every test
    skipped without CUDA (a skipif whose reason names CUDA or GPUs) with `cuda`, so that `pytest -m cuda`
    (scripts/gpu_check.sh) selects exactly the tests that only a GPU machine runs."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
    for item in items:
        for mark in item.iter_markers("skipif"):
            reason = str(mark.kwargs.get("reason", ""))
            if "cuda" in reason.lower() or "gpu" in reason.lower():
                item.add_marker(pytest.mark.cuda)
                break


def pytest_collection_finish(session):
    gc_policy.resume(automatic=True)  # the tests run with Python's automatic GC, as the package's users do


def train_env(**extra) -> dict:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",  # with several ranks on 2 cores, more threads per rank only thrash
        HF_DATASETS_OFFLINE="1",
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=str(ROOT),
    )
    env.update(extra)
    return env


def import_script(name: str):
    """scripts/<name>.py imported as a module (the scripts folder is not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(
    nproc: int, script: str, args: list[str], timeout: int = 600, env: dict | None = None, torchrun_args=()
) -> subprocess.CompletedProcess:
    """Run `script` from the repo root: plain python for nproc == 1, else torchrun --standalone."""
    cmd = [*local_command(nproc, script, tuple(torchrun_args)), *args]
    r = subprocess.run(cmd, cwd=ROOT, env=env or train_env(), capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-5000:] + r.stderr[-5000:])
    return r


def run_train(
    nproc: int, args: list[str], timeout: int = 600, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`python train.py` for nproc == 1, else torchrun --standalone with nproc local workers."""
    return run_script(nproc, "train.py", args, timeout, env)


def train_together(nproc: int, runs: dict[str, list[str]], root: Path, timeout: int = 900) -> dict[str, Path]:
    """Train every named argument list in one `nproc`-rank torchrun, one run after the other
    (tests/dist/train_many.py --together): the interpreter, torch and torchrun start once for all of them. Each run
    writes to root/<name>; returns those folders by name. A failed run fails the call (the runs after it do not
    run)."""
    root.mkdir(parents=True, exist_ok=True)
    folders = {name: root / name for name in runs}
    spec = root / "runs.json"
    spec.write_text(
        json.dumps([[*args, f"--job.dump_folder={folders[name]}"] for name, args in runs.items()])
    )
    r = run_script(nproc, "tests/dist/train_many.py", [str(spec), "--together"], timeout)
    assert r.returncode == 0, (
        f"runs {', '.join(runs)} on {nproc} processes: exit {r.returncode} (output above)"
    )
    return folders


# ---- checkpoint runs shared by tests/test_checkpoint.py and tests/test_faults.py ------------------------------

CKPT_STEPS = 6
CKPT_ARGS = TINY + [
    f"--training.steps={CKPT_STEPS}",
    "--training.mixed_precision_param=float32",
    "--lr_scheduler.warmup_steps=2",
    FIXED_PEAK,  # these runs are about state, not speed
    "--checkpoint.enable=true",
    "--checkpoint.interval=3",
]
# 2-process runs use virtual data shards, so a 1-process run with 2 shards sees the same global batches.
CKPT_ARGS2 = CKPT_ARGS + ["--data.num_shards=2"]


def losses(out) -> dict[int, float]:
    """Per-step losses of a run's metrics.jsonl (full float precision); each step must appear once."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows]
    assert len(steps) == len(set(steps)), f"duplicated steps in metrics.jsonl: {steps}"
    return {r["step"]: r["loss/global_avg"] for r in rows}


def steps_in(out) -> list[int]:
    from torchtitan.checkpoint import committed_checkpoints

    return sorted(committed_checkpoints(str(out / "checkpoint")))


_SHARED: dict[str, Path] = {}  # shared_run's folders, by name, in this pytest process


def shared_run(tmp_path_factory, worker_id: str, name: str, build) -> Path:
    """A run that tests in several files read (never write: copy it), made once per pytest session even when
    those files run on different pytest-xdist workers: the first worker to ask builds it under a file lock in
    the session's shared temporary folder, the others wait for it and read the same folder. Within one process
    (with or without xdist) a second call returns the folder of the first."""
    if name in _SHARED:
        return _SHARED[name]
    if worker_id == "master":  # no xdist: the session's own temporary folder
        out = tmp_path_factory.mktemp(name)
        build(out)
        _SHARED[name] = out
        return out
    from filelock import FileLock

    out = tmp_path_factory.getbasetemp().parent / f"shared-{name}"  # one folder per session, all workers
    with FileLock(f"{out}.lock"):
        if not (out / ".built").exists():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            build(out)  # asserts; a failure leaves no .built, so the next worker tries (and fails) itself
            (out / ".built").touch()
    _SHARED[name] = out
    return out


def _straight1(out) -> None:
    r = run_train(1, CKPT_ARGS + [f"--job.dump_folder={out}"])
    assert r.returncode == 0
    assert steps_in(out) == [3, 6]


def _straight2(out) -> None:
    r = run_train(2, CKPT_ARGS2 + [f"--job.dump_folder={out}", "--checkpoint.async_mode=async"])
    assert r.returncode == 0


@pytest.fixture(scope="session")
def straight1(tmp_path_factory, worker_id):
    """An uninterrupted 1-process run with sync saves at steps 3 and 6 (read-only for the tests: copy it)."""
    return shared_run(tmp_path_factory, worker_id, "straight1", _straight1)


@pytest.fixture(scope="session")
def straight2(tmp_path_factory, worker_id):
    """An uninterrupted FSDP 2 run with async saves at steps 3 and 6 (read-only for the tests: copy it)."""
    return shared_run(tmp_path_factory, worker_id, "straight2", _straight2)
