"""Gradient clipping across meshes and pipeline stages (2 processes, gloo)."""

import subprocess
import sys

from conftest import ROOT, train_env


def test_clip_grad_norm_across_meshes_and_pp_stages():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    r = subprocess.run(
        [*cmd, "tests/dist/clip_norm.py"],
        cwd=ROOT,
        env=train_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "ok"
