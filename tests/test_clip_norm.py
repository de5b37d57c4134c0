"""Gradient clipping across meshes and pipeline stages (2 processes, gloo)."""

from conftest import run_script


def test_clip_grad_norm_across_meshes_and_pp_stages():
    r = run_script(2, "tests/dist/clip_norm.py", [], timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "ok"
