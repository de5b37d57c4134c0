#!/usr/bin/env python
"""Throughput and peak memory: the full trainer, and a bare PyTorch loop over the same model, batch and data.

    python scripts/bench.py                                  # debug model, 1 process, trainer vs bare loop
    python scripts/bench.py --nproc 2 --repeat 3             # 2 processes: trainer vs a bare FSDP2 loop
    python scripts/bench.py --steps 60 -- --training.mixed_precision_param=float32
    python scripts/bench.py --mode trainer -- --job.config_file=train_configs/llama3_8b.toml ...

Both measure the same way: wall time over intervals of `--interval` steps after `--warmup` steps, tokens/s per
device = tokens in the interval / interval time (no device sync inside an interval; one at its end on CUDA),
median over intervals. The trainer's own figures come from its metrics.jsonl (docs/metrics.md); MFU uses the
peak the trainer resolved. Peak memory is the highest per-interval peak after warm-up of rank 0: process RSS
on CPU, the caching allocator's max reserved on CUDA (torchtitan/metrics/memory.py, both sides).

The bare loop is what a user would write by hand, in its own process(es) like the trainer: the same Transformer
and init, the same data stream and loss, torch's AdamW with the trainer's kernel choice (optimizer.implementation)
and torch.nn.utils.clip_grad_norm_, and the same matmul kernels (on a CPU without bf16 instructions a bf16 model
gets the trainer's fp32-kernel linears and attention, torchtitan/parallel/cpu_bf16.py, so the ratio measures
the framework and not the kernels). One process: fp32 master weights, bf16 autocast when the config asks for bf16
parameters. N processes (torchrun, gloo on CPU): fully_shard on every block and the root, a MixedPrecisionPolicy
from the config, FSDP's default gradient averaging with a mean loss. Ratio = trainer / bare, per alternating pair.
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

CONFIG = "--job.config_file=train_configs/debug_model.toml"
PEAK_KEYS = ("memory/max_reserved_gib", "memory/max_rss_gib")  # CUDA, CPU


def trainer(nproc: int, steps: int, interval: int, warmup: int, overrides: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as dump:
        cmd = local_command(nproc, str(ROOT / "train.py"))
        args = [
            CONFIG,
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
    key = next(k for k in PEAK_KEYS if k in rows[0])
    return {
        "tokens_per_sec_per_device": statistics.median(
            r["throughput/tokens_per_sec_per_device"] for r in rows
        ),
        "mfu_percent": statistics.median(r["mfu/percent"] for r in rows),
        "peak_memory_gib": max(r[key] for r in rows),
        "intervals": len(rows),
    }


def bare(nproc: int, steps: int, interval: int, warmup: int, overrides: list[str]) -> dict:
    """Run the bare loop in fresh process(es), like the trainer, and return rank 0's figures."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bare.json")
        worker = [f"--bare-worker={out}", f"--steps={steps}", f"--interval={interval}", f"--warmup={warmup}"]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        cmd = [*local_command(nproc, str(Path(__file__).resolve())), *worker, "--", *overrides]
        subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            return json.load(f)


class IntervalMeter:
    """How both hand-written loops (the bare loop here, transformers' in bench_peers.py) are timed, as the trainer
    logs: every `interval` steps a host read of the loss waits for the device; after `warmup` steps each interval
    gives tokens/s and its peak memory (RSS on CPU, max reserved on CUDA)."""

    def __init__(self, device, interval: int, warmup: int, tokens_per_step: int):
        from torchtitan.metrics.memory import MemoryMonitor

        self.memory = MemoryMonitor(device)
        self.interval, self.warmup, self.tokens = interval, warmup, tokens_per_step
        self.rates, self.peaks, self.start = [], [], time.perf_counter()

    def after_step(self, step: int, loss) -> None:
        if step % self.interval:
            return
        loss.item()  # waits for the device, like the trainer's log step
        now = time.perf_counter()
        if step > self.warmup:
            self.rates.append(self.interval * self.tokens / (now - self.start))
            snap = self.memory.snapshot()
            self.peaks.append(snap.get("memory/max_reserved_gib", snap.get("memory/max_rss_gib", 0.0)))
        self.memory.reset_peak()
        self.start = time.perf_counter()

    def result(self) -> dict:
        return {
            "tokens_per_sec_per_device": statistics.median(self.rates),
            "peak_memory_gib": max(self.peaks),
            "intervals": len(self.rates),
        }


def bare_worker(out: str, steps: int, interval: int, warmup: int, overrides: list[str]) -> None:
    """The hand-written loop (see the module docstring); rank 0 writes its figures to `out` as JSON."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from torchtitan.config import parse_args
    from torchtitan.data import build_dataloader, build_tokenizer
    from torchtitan.models import get_model_class, model_args_from_config
    from torchtitan.parallel import local_coords
    from torchtitan.parallel.cpu_bf16 import use_cpu_bf16_kernels

    cfg = parse_args([CONFIG, *overrides])
    t, o = cfg.training, cfg.optimizer
    world = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(t.seed)
    bf16 = t.mixed_precision_param == "bfloat16"
    model_cls, model_args = get_model_class(cfg.model.name), model_args_from_config(cfg.model, t.seq_len)
    dtype = torch.bfloat16 if bf16 else torch.float32
    if world == 1:
        model = model_cls(model_args).to(device)
        model.init_weights(t.seed)
        use_cpu_bf16_kernels(model, device.type, dtype, t.cpu_bf16_fp32_kernels)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        mesh = init_device_mesh(device.type, (world,))
        with torch.device("meta"):
            model = model_cls(model_args)
        use_cpu_bf16_kernels(model, device.type, dtype, t.cpu_bf16_fp32_kernels)
        mp = MixedPrecisionPolicy(
            param_dtype=dtype,
            reduce_dtype=torch.bfloat16 if t.mixed_precision_reduce == "bfloat16" else torch.float32,
        )
        for block in model.layers.values():
            fully_shard(block, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        model.to_empty(device=device)
        model.init_weights(t.seed, local_coords=local_coords)
    impl = {"foreach": {"foreach": True}, "fused": {"fused": True}, "for-loop": {"foreach": False}}
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=o.lr,
        betas=(o.beta1, o.beta2),
        eps=o.eps,
        weight_decay=o.weight_decay,
        **impl[o.implementation],
    )
    data = iter(
        build_dataloader(
            dataset=cfg.data.dataset,
            dataset_path=cfg.data.dataset_path,
            text_field=cfg.data.text_field,
            tokenizer=build_tokenizer(cfg.model.tokenizer_path),
            dp_rank=rank,
            dp_world_size=world,
            batch_size=t.local_batch_size,
            seq_len=t.seq_len,
        )
    )
    autocast = world == 1 and bf16  # with FSDP the MixedPrecisionPolicy casts
    meter = IntervalMeter(device, interval, warmup, t.local_batch_size * t.seq_len)
    for step in range(1, steps + 1):
        x, y = (b.to(device) for b in next(data))
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.max_norm, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        meter.after_step(step, loss)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(meter.result(), f)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["both", "trainer", "bare"], default="both")
    p.add_argument("--nproc", type=int, default=1, help="processes for the trainer and the bare loop")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--interval", type=int, default=5)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--repeat", type=int, default=1, help="alternate trainer and bare runs this many times")
    p.add_argument("--bare-worker", help=argparse.SUPPRESS)  # internal: run the bare loop, write JSON here
    p.add_argument("overrides", nargs="*", help="config overrides after --, applied to both")
    a = p.parse_args()
    if a.bare_worker:
        bare_worker(a.bare_worker, a.steps, a.interval, a.warmup, a.overrides)
        return 0
    runs = {"trainer": [], "bare": []}
    for _ in range(a.repeat):  # alternating, so drift in machine speed hits both alike
        if a.mode in ("both", "trainer"):
            runs["trainer"].append(trainer(a.nproc, a.steps, a.interval, a.warmup, a.overrides))
        if a.mode in ("both", "bare"):
            runs["bare"].append(bare(a.nproc, a.steps, a.interval, a.warmup, a.overrides))
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
