"""Shared test helpers: run the trainer in 1..N processes exactly as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from torchtitan.launch import local_command

ROOT = Path(__file__).resolve().parents[1]

# Small, fast settings for end-to-end runs of the debug model on a 2-core CPU.
TINY = [
    "--job.config_file=train_configs/debug_model.toml",
    "--training.local_batch_size=2",
    "--training.seq_len=64",
    "--metrics.log_freq=1",
    "--job.print_config=false",
]


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
