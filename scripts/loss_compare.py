#!/usr/bin/env python
"""Loss parity: train two layouts on the same seed and data and compare per-step loss and grad norm.

    python scripts/loss_compare.py --nproc 1 --args "--parallelism.data_parallel_shard_degree=1" \\
        --nproc-b 4 --args-b "--parallelism.tensor_parallel_degree=2" \\
        --common "--job.config_file=train_configs/debug_model.toml --training.steps=10" --rtol 1e-4

Both runs write metrics.jsonl (log_freq is forced to 1) into their own dump folder; the script prints one row
per step and exits 1 if any step differs by more than the tolerance, 0 otherwise. Use fp32 parameters and
reduction (the default here) so the only difference left is the order of floating-point reductions.
On GPUs pass the same flags; on CPU it uses gloo.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from torchtitan.launch import local_command  # noqa: E402

# fp32 everywhere and a log line per step: what parity needs, overridable by --common.
PARITY_DEFAULTS = [
    "--training.mixed_precision_param=float32",
    "--training.mixed_precision_reduce=float32",
    "--metrics.log_freq=1",
    "--metrics.enable_tensorboard=false",
    "--job.print_config=false",
]


def run(nproc: int, args: list[str], dump: str, timeout: int = 900, script: str = "train.py") -> list[dict]:
    """Train with `args` on nproc processes (`script`: the entry point, relative to the repo); return the
    metrics.jsonl rows."""
    cmd = local_command(nproc, str(ROOT / script))
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run(
        [*cmd, *PARITY_DEFAULTS, *args, f"--job.dump_folder={dump}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if r.returncode != 0:
        raise RuntimeError(
            f"run failed ({' '.join(args)}), exit {r.returncode}:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
        )
    with open(os.path.join(dump, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def compare(rows_a: list[dict], rows_b: list[dict], rtol: float, keys=("loss/global_avg", "grad_norm")):
    """Per-step relative differences; returns (report lines, worst relative difference per key)."""
    lines, worst = [], dict.fromkeys(keys, 0.0)
    assert [r["step"] for r in rows_a] == [r["step"] for r in rows_b], "the runs logged different steps"
    header = f"{'step':>5} " + " ".join(f"{k + ' A':>18} {k + ' B':>18} {'rel diff':>9}" for k in keys)
    lines.append(header)
    for a, b in zip(rows_a, rows_b):
        cells = []
        for k in keys:
            va, vb = a[k], b[k]
            rel = abs(va - vb) / max(abs(va), 1e-12)
            worst[k] = max(worst[k], rel)
            cells.append(f"{va:18.10f} {vb:18.10f} {rel:9.2e}{' *' if rel > rtol else ''}")
        lines.append(f"{a['step']:>5} " + " ".join(cells))
    return lines, worst


def loss_compare(
    args_a: list[str],
    args_b: list[str],
    nproc_a: int = 1,
    nproc_b: int = 1,
    common: list[str] = (),
    rtol: float = 1e-4,
):
    """Run both layouts and return (ok, report text, worst relative difference per key)."""
    with tempfile.TemporaryDirectory() as tmp:
        rows_a = run(nproc_a, [*common, *args_a], os.path.join(tmp, "a"))
        rows_b = run(nproc_b, [*common, *args_b], os.path.join(tmp, "b"))
    lines, worst = compare(rows_a, rows_b, rtol)
    ok = all(v <= rtol for v in worst.values())
    lines.append(
        "worst relative difference: "
        + ", ".join(f"{k} {v:.2e}" for k, v in worst.items())
        + f" (rtol {rtol:g})"
    )
    return ok, "\n".join(lines), worst


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--args", default="", help="overrides for run A (baseline)")
    p.add_argument("--args-b", default="", help="overrides for run B (candidate)")
    p.add_argument("--nproc", type=int, default=1, help="processes for run A")
    p.add_argument("--nproc-b", type=int, default=1, help="processes for run B")
    p.add_argument("--common", default="--job.config_file=train_configs/debug_model.toml --training.steps=10")
    p.add_argument("--rtol", type=float, default=1e-4, help="max relative difference per step")
    a = p.parse_args()
    ok, report, _ = loss_compare(
        shlex.split(a.args), shlex.split(a.args_b), a.nproc, a.nproc_b, shlex.split(a.common), a.rtol
    )
    print(report)
    print("PARITY OK" if ok else "PARITY FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
