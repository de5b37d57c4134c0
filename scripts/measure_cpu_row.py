"""Measure one CPU configuration of this machine for tests/estimate_reference.toml, without printing its estimate.

    python scripts/measure_cpu_row.py --id cpu_debug10l_2proc_tp2_b4_s24 --source ours_cpu_heldout4 --nproc 2 \\
        --describe "the debug model with 10 layers, TP 2, batch 4 x 256" -- \\
        --job.config_file=train_configs/debug_model.toml --model.n_layers=10 --parallelism.tensor_parallel_degree=2

The protocol of the validation log (docs/estimate_log.md, "The CPU step measured at two depths"): `--runs` trainer
runs (default 3), each after a `--pause` (15 s), `train.py --training.steps=30 --metrics.log_freq=1 [flags]` under
torchrun for more than one process, OMP_NUM_THREADS=1 per process; then the calibration with the same flags
(`python -m torchtitan.estimate ... --estimate.hardware=cpu --estimate.num_devices=N --estimate.calibrate=true`).
  step_time_s  = the median over the runs of each run's median logged `time/step_s` after step 10
  max_rss_gib  = the median over the runs of rank 0's largest logged `memory/max_rss_gib` (left out for PP, where
                 rank 0 holds one stage only)
Prints the row as TOML on stdout: the figures and the calibration. The calibration's report (which holds the
estimate) goes to a file the script deletes, so that a held-out row can be committed before anyone sees its
estimate; `python scripts/estimate_validation.py` estimates it afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEPS = 30
AFTER_STEP = 10


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def run_once(nproc: int, flags: list[str], folder: Path) -> tuple[float, float | None]:
    """One trainer run: (its median step time after step 10, rank 0's largest peak RSS)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    train = [
        "train.py",
        f"--job.dump_folder={folder}",
        f"--training.steps={STEPS}",
        "--metrics.log_freq=1",
        *flags,
    ]
    if nproc > 1:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            *train,
        ]
    else:
        cmd = [sys.executable, *train]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"error: the run failed (exit {done.returncode}): {' '.join(cmd)}\n{done.stderr[-3000:]}")
    records = [
        json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()
    ]
    steps = [r["time/step_s"] for r in records if r["step"] > AFTER_STEP and "time/step_s" in r]
    if not steps:
        sys.exit(f"error: {folder / 'metrics.jsonl'} holds no step time after step {AFTER_STEP}")
    rss = [r["memory/max_rss_gib"] for r in records if "memory/max_rss_gib" in r]
    return statistics.median(steps), (max(rss) if rss else None)


def calibrate(nproc: int, flags: list[str], folder: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = folder / "estimate.json"
    cmd = [sys.executable, "-m", "torchtitan.estimate", *flags, "--estimate.hardware=cpu",
           f"--estimate.num_devices={nproc}", "--estimate.calibrate=true", "--estimate.accuracy=false",
           f"--estimate.json={out}"]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"error: the calibration failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())["calibration"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--id", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--nproc", type=int, required=True)
    ap.add_argument("--describe", required=True, help="the configuration in words, for the row's comment")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--pause", type=float, default=15.0)
    ap.add_argument("--pp", action="store_true", help="a pipeline-parallel plan: no peak RSS figure")
    ap.add_argument("flags", nargs="+", help="the training flags (after --)")
    a = ap.parse_args()

    steps, rsss, loads = [], [], []
    start = time.strftime("%H:%M:%S", time.gmtime(time.time() + a.pause))
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.runs):
            time.sleep(a.pause)
            loads.append(os.getloadavg()[0])
            step, rss = run_once(a.nproc, a.flags, Path(tmp) / f"run{i}")
            steps.append(step)
            rsss.append(rss)
            print(f"# run {i + 1}: step {step:.4f} s, rank 0 peak RSS {rss}", file=sys.stderr)
        cal_load = os.getloadavg()[0]
        cal_at = time.strftime("%H:%M:%S", time.gmtime())
        cal = calibrate(a.nproc, a.flags, Path(tmp))

    lines = ["[[cpu]]", f"id = {_toml(a.id)}", f"source = {_toml(a.source)}", f"num_devices = {a.nproc}",
             f"args = {_toml(a.flags)}"]  # fmt: skip
    comment = f"# {a.describe}; per-run medians of step_s after step {AFTER_STEP}: {', '.join(f'{s:.4f}' for s in steps)}"
    if not a.pp:
        comment += f"; rank 0's peak RSS per run: {', '.join(f'{r:.3f}' for r in rsss)}"
    comment += (
        f"; load average before each run: {', '.join(f'{x:.2f}' for x in loads)} (before the calibration:"
        f" {cal_load:.2f}); runs from {start} UTC, the calibration at {cal_at}"
    )
    lines += [comment, f"step_time_s = {round(statistics.median(steps), 4)}"]
    if not a.pp:
        lines.append(f"max_rss_gib = {round(statistics.median(rsss), 3)}")
    lines.append("[cpu.calibration]")
    for key, value in cal.items():
        if value is None or value == [] or value == {}:
            continue
        if isinstance(value, float):
            value = float(f"{value:.6g}")
        elif isinstance(value, list):
            value = [[float(f"{x:.6g}") if isinstance(x, float) else x for x in v] if isinstance(v, list) else v
                     for v in value]  # fmt: skip
        lines.append(f"{key} = {_toml(value)}")
    print("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
