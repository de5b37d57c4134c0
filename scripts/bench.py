#!/usr/bin/env python
"""Throughput benchmark: the full trainer, and a bare PyTorch loop over the same model, batch and data.

    python scripts/bench.py                                  # debug model, 1 process, trainer vs bare loop
    python scripts/bench.py --nproc 2 --steps 60 -- --training.seq_len=512
    python scripts/bench.py --mode trainer -- --job.config_file=train_configs/llama3_8b.toml ...

Both measure the same way: wall time over intervals of `--interval` steps after `--warmup` steps, tokens/s per
device = tokens in the interval / interval time (no device sync inside an interval; one at its end on CUDA),
median over intervals. The trainer's own figures come from its metrics.jsonl (docs/metrics.md); MFU uses the
peak the trainer resolved. The bare loop is what a user would write by hand: the same Transformer and init, the
same data stream and loss, AdamW, gradient clipping; fp32 master weights with bf16 autocast when the trainer
runs with bf16 parameters. Overhead = 1 - trainer / bare.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from torchtitan.launch import local_command  # noqa: E402


def trainer(nproc: int, steps: int, interval: int, warmup: int, overrides: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as dump:
        cmd = local_command(nproc, str(ROOT / "train.py"))
        args = [
            "--job.config_file=train_configs/debug_model.toml",
            f"--training.steps={steps}",
            f"--metrics.log_freq={interval}",
            "--metrics.enable_tensorboard=false",
            "--job.print_config=false",
            *overrides,
            f"--job.dump_folder={dump}",
        ]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        subprocess.run([*cmd, *args], cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(dump, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f]
    # rows at steps 1, interval, 2*interval, ...: each row after the warm-up covers one full interval
    rows = [r for r in rows if r["step"] > warmup and r["step"] % interval == 0]
    return {
        "tokens_per_sec_per_device": statistics.median(
            r["throughput/tokens_per_sec_per_device"] for r in rows
        ),
        "mfu_percent": statistics.median(r["mfu/percent"] for r in rows),
        "intervals": len(rows),
    }


def bare(steps: int, interval: int, warmup: int, overrides: list[str]) -> dict:
    """A hand-written single-process loop over the same model/data as the trainer's config."""
    import torch
    import torch.nn.functional as F

    from torchtitan.config import parse_args
    from torchtitan.data import build_dataloader, build_tokenizer
    from torchtitan.models import get_model_class, model_args_from_config

    cfg = parse_args(["--job.config_file=train_configs/debug_model.toml", *overrides])
    t = cfg.training
    torch.manual_seed(t.seed)
    model = get_model_class(cfg.model.name)(model_args_from_config(cfg.model, t.seq_len))
    model.init_weights(t.seed)
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=cfg.optimizer.lr,
        betas=(cfg.optimizer.beta1, cfg.optimizer.beta2),
        foreach=True,
    )
    data = iter(
        build_dataloader(
            dataset=cfg.data.dataset,
            dataset_path=cfg.data.dataset_path,
            text_field=cfg.data.text_field,
            tokenizer=build_tokenizer(cfg.model.tokenizer_path),
            dp_rank=0,
            dp_world_size=1,
            batch_size=t.local_batch_size,
            seq_len=t.seq_len,
        )
    )
    use_bf16 = t.mixed_precision_param == "bfloat16"
    rates, start = [], time.perf_counter()
    for step in range(1, steps + 1):
        x, y = next(data)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
            logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.max_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % interval == 0:
            loss.item()
            now = time.perf_counter()
            if step > warmup:
                rates.append(interval * t.local_batch_size * t.seq_len / (now - start))
            start = now
    return {"tokens_per_sec_per_device": statistics.median(rates), "intervals": len(rates)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["both", "trainer", "bare"], default="both")
    p.add_argument(
        "--nproc", type=int, default=1, help="trainer processes (the bare loop is always 1 process)"
    )
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--interval", type=int, default=5)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--repeat", type=int, default=1, help="alternate trainer and bare runs this many times")
    p.add_argument("overrides", nargs="*", help="config overrides after --, applied to both")
    a = p.parse_args()
    runs = {"trainer": [], "bare": []}
    for _ in range(a.repeat):  # alternating, so drift in machine speed hits both alike
        if a.mode in ("both", "trainer"):
            runs["trainer"].append(trainer(a.nproc, a.steps, a.interval, a.warmup, a.overrides))
        if a.mode in ("both", "bare"):
            runs["bare"].append(bare(a.steps, a.interval, a.warmup, a.overrides))
    result = {}
    for name, rs in runs.items():
        if rs:
            result[name] = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            result[name]["runs_tokens_per_sec"] = [round(r["tokens_per_sec_per_device"]) for r in rs]
    if a.mode == "both":
        ratios = [
            t["tokens_per_sec_per_device"] / b["tokens_per_sec_per_device"] for t, b in zip(*runs.values())
        ]
        result["trainer_over_bare_median"] = statistics.median(ratios)
        result["trainer_over_bare_runs"] = [round(r, 4) for r in ratios]
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
