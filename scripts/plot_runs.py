#!/usr/bin/env python
"""Plot one or more runs side by side: PNGs of loss, throughput, MFU, memory and the goodput breakdown.

    python scripts/plot_runs.py outputs/fsdp2 outputs/fsdp2_tp2 --out plots [--labels "FSDP 2,FSDP 2 x TP 2"]

Each RUN_DIR is a run's dump folder (its tb/ event files are read with TensorBoard's reader; without them its
metrics.jsonl), or the tb folder or the metrics.jsonl itself. Written into --out, for the figures some run has
data for:
    loss.png        training loss (solid) and validation loss (dashed, markers) vs step and vs tokens seen
    throughput.png  tokens/s per device and global vs step
    mfu.png         MFU (%) vs step
    memory.png      peak memory per interval vs step (CUDA max reserved, or CPU max RSS), GiB
    goodput.png     where each run's wall clock went (goodput/* parts at its last log step), stacked bars
Runs keep one color in every figure. Needs matplotlib (pip install matplotlib; it is in the dev extras).
Tag definitions: docs/metrics.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchtitan.errors import UserError  # noqa: E402
from torchtitan.metrics.goodput import PARTS  # noqa: E402
from torchtitan.metrics.sinks import read_tensorboard_scalars  # noqa: E402

Series = dict[str, list[tuple[int, float]]]  # tag -> [(step, value), ...] sorted by step


def read_run(path: str) -> Series:
    """Every scalar of a run: from TensorBoard event files when present, else from metrics.jsonl."""
    p = Path(path)
    if p.is_file() and p.suffix == ".jsonl":
        return _read_jsonl(p)
    if (p / "tb").is_dir():
        p = p / "tb"
    if p.is_dir() and any(f.name.startswith("events.out.tfevents") for f in p.iterdir()):
        return {tag: sorted(points) for tag, points in read_tensorboard_scalars(p).items()}
    if (p / "metrics.jsonl").is_file():
        return _read_jsonl(p / "metrics.jsonl")
    raise UserError(
        f"{path}: no TensorBoard event files (tb/) and no metrics.jsonl found; pass a run's dump folder"
    )


def _read_jsonl(path: Path) -> Series:
    series: Series = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        for tag, value in row.items():
            if tag != "step" and isinstance(value, (int, float)):
                series.setdefault(tag, []).append((int(row["step"]), float(value)))
    return {tag: sorted(points) for tag, points in series.items()}


def _tokens_per_step(run: Series) -> float | None:
    points = run.get("progress/tokens_seen")
    if not points:
        return None
    step, tokens = points[-1]
    return tokens / step if step else None


def _plot_lines(ax, runs, labels, colors, tag, ylabel, title) -> bool:
    drawn = False
    for run, label, color in zip(runs, labels, colors):
        if run.get(tag):
            steps, values = zip(*run[tag])
            ax.plot(steps, values, label=label, color=color)
            drawn = True
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize="small")
    return drawn


def plot(runs: list[Series], labels: list[str], out: Path) -> list[Path]:
    try:
        import matplotlib
    except ImportError:
        raise UserError(
            "scripts/plot_runs.py needs matplotlib: pip install matplotlib (it is in the dev extras)"
        ) from None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    colors = [plt.get_cmap("tab10")(i % 10) for i in range(len(runs))]
    written = []

    def save(fig, name):
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    if any(r.get("loss/global_avg") or r.get("validation/loss") for r in runs):
        fig, (by_step, by_tokens) = plt.subplots(1, 2, figsize=(12, 4.5))
        for run, label, color in zip(runs, labels, colors):
            per_step = _tokens_per_step(run)
            for tag, style, name in (
                ("loss/global_avg", "-", "train"),
                ("validation/loss", "--o", "validation"),
            ):
                if not run.get(tag):
                    continue
                steps, values = zip(*run[tag])
                kw = dict(color=color, label=f"{label} ({name})", markersize=3)
                by_step.plot(steps, values, style, **kw)
                if per_step:
                    by_tokens.plot([s * per_step for s in steps], values, style, **kw)
        for ax, xlabel in ((by_step, "step"), (by_tokens, "tokens seen")):
            ax.set_xlabel(xlabel)
            ax.set_ylabel("loss (token cross-entropy)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize="small")
        by_step.set_title("loss vs step")
        by_tokens.set_title("loss vs tokens")
        save(fig, "loss.png")

    if any(r.get("throughput/tokens_per_sec_per_device") for r in runs):
        fig, (dev, glob) = plt.subplots(1, 2, figsize=(12, 4.5))
        _plot_lines(
            dev,
            runs,
            labels,
            colors,
            "throughput/tokens_per_sec_per_device",
            "tokens/s",
            "tokens/s per device",
        )
        _plot_lines(
            glob, runs, labels, colors, "throughput/tokens_per_sec_global", "tokens/s", "tokens/s global"
        )
        save(fig, "throughput.png")

    if any(r.get("mfu/percent") for r in runs):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        _plot_lines(ax, runs, labels, colors, "mfu/percent", "MFU (%)", "model FLOPs utilization")
        save(fig, "mfu.png")

    memory_tag = next(
        (t for t in ("memory/max_reserved_gib", "memory/max_rss_gib") if any(r.get(t) for r in runs)), None
    )
    if memory_tag:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        what = "max reserved (CUDA)" if "reserved" in memory_tag else "max RSS (CPU)"
        _plot_lines(ax, runs, labels, colors, memory_tag, "GiB", f"peak memory per interval: {what}")
        save(fig, "memory.png")

    with_goodput = [(r, lab) for r, lab in zip(runs, labels) if r.get("goodput/wall_s")]
    if with_goodput:
        fig, ax = plt.subplots(figsize=(10, 1.6 + 0.6 * len(with_goodput)))
        part_colors = [plt.get_cmap("tab10")(i % 10) for i in range(len(PARTS))]
        longest = 0.0
        for row, (run, _) in enumerate(with_goodput):
            left = 0.0
            for part, color in zip(PARTS, part_colors):
                seconds = run.get(f"goodput/{part}_s", [(0, 0.0)])[-1][1]
                ax.barh(row, seconds, left=left, color=color, label=part if row == 0 else None)
                left += seconds
            percent = run.get("goodput/percent", [(0, 0.0)])[-1][1]
            ax.text(left, row, f" {percent:.1f}% goodput", va="center", fontsize="small")
            longest = max(longest, left)
        ax.set_xlim(0, longest * 1.2)  # room for the labels
        ax.set_yticks(range(len(with_goodput)), [lab for _, lab in with_goodput])
        ax.set_xlabel("seconds since the job started")
        ax.set_title("goodput: where the wall clock went")
        ax.legend(fontsize="x-small", loc="center left", bbox_to_anchor=(1.01, 0.5))
        save(fig, "goodput.png")
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "runs", nargs="+", metavar="RUN_DIR", help="a run's dump folder (or its tb/ or metrics.jsonl)"
    )
    p.add_argument("--out", required=True, help="folder for the PNGs")
    p.add_argument(
        "--labels", default=None, help="comma-separated legend labels, one per run (default: folder names)"
    )
    a = p.parse_args(argv)
    try:
        labels = a.labels.split(",") if a.labels else [Path(r).resolve().name for r in a.runs]
        if len(labels) != len(a.runs):
            raise UserError(f"--labels has {len(labels)} labels for {len(a.runs)} runs; give one per run")
        written = plot([read_run(r) for r in a.runs], labels, Path(a.out))
        if not written:
            raise UserError(f"none of {', '.join(a.runs)} has any metric to plot")
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
