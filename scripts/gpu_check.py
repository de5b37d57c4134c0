#!/usr/bin/env python
"""Validate an install on this machine's GPU(s): the CUDA-only tests, then a smoke matrix on the debug model.

    scripts/gpu_check.sh                       # auto: GPU checks where CUDA is present, else the CPU ones
    scripts/gpu_check.sh --cpu                 # CPU only (CUDA-only checks print SKIP)
    scripts/gpu_check.sh --only bf16,resume    # a subset (--list names them)
    scripts/gpu_check.sh --out /tmp/gc         # where the logs go (default outputs/gpu_check)

One line per check, `PASS|FAIL|SKIP  name  seconds  log`, then a summary; exit 1 if any check failed, 2 on a bad
argument. Every check runs the real entry points in subprocesses (train.py, pytest, scripts/convert_dcp_to_hf.py)
and judges their output files, so a failing check leaves its log and its run folder under --out. On CPU the
runs use 2 x 64 tokens per step instead of the debug config's 8 x 256, so they stay short on a small machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "--job.config_file=train_configs/debug_model.toml"
F8_MIN_DIM = "--float8.min_dim=64"  # the debug model's linears are 256 wide: below the 1024 default


class Check:
    def __init__(self, name: str, what: str, fn, cuda_only: bool = False, min_gpus: int = 0):
        self.name, self.what, self.fn, self.cuda_only, self.min_gpus = name, what, fn, cuda_only, min_gpus


class Ctx:
    def __init__(self, out: Path, cuda: bool, gpus: int, py: str):
        self.out, self.cuda, self.gpus, self.py = out, cuda, gpus, py
        self.log: Path | None = None

    def env(self) -> dict:
        env = dict(os.environ, PYTHONPATH=str(ROOT), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        return env

    def run(self, cmd: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
        """Run from the repo root, appending the command and its output to this check's log."""
        with open(self.log, "a") as f:
            f.write("$ " + " ".join(cmd) + "\n")
            f.flush()
            r = subprocess.run(cmd, cwd=ROOT, env=env or self.env(), stdout=f, stderr=subprocess.STDOUT)
            f.write(f"[exit {r.returncode}]\n")
        return r

    def train(self, folder: str, steps: int, *extra: str, nproc: int = 1, losses: bool = True) -> Path:
        """train.py on the debug model into <out>/<folder>; raises if it fails or (losses=True) a loss is not
        finite. A simulated rank has no meaningful loss, and only rank 0 writes metrics.jsonl."""
        dump = self.out / folder
        size = [] if self.cuda else ["--training.local_batch_size=2", "--training.seq_len=64"]
        args = [
            CONFIG,
            f"--training.steps={steps}",
            "--metrics.log_freq=1",
            "--job.print_config=false",
            *size,
            *extra,
            f"--job.dump_folder={dump}",
        ]
        if nproc > 1:
            cmd = [self.py, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        else:
            cmd = [self.py]
        r = self.run([*cmd, "train.py", *args])
        if r.returncode != 0:
            lines = [x for x in log_text(self).splitlines() if x.strip() and not x.startswith("[exit")]
            raise CheckFailed(f"train.py exited {r.returncode}: {lines[-1] if lines else ''}")
        if not losses:
            return dump
        rows = metrics(dump)
        bad = [s for s, v in rows.items() if not math.isfinite(v)]
        if bad or not rows:
            raise CheckFailed(f"non-finite or missing losses at steps {bad or 'all'}")
        return dump


class CheckFailed(Exception):
    pass


def metrics(dump: Path) -> dict[int, float]:
    path = dump / "metrics.jsonl"
    if not path.is_file():
        raise CheckFailed(f"{path} missing")
    return {r["step"]: r["loss/global_avg"] for r in map(json.loads, path.read_text().splitlines())}


def log_text(ctx: Ctx) -> str:
    return ctx.log.read_text(errors="replace")


# ---- the checks ------------------------------------------------------------------------------------------------


def unexpected_skips(pytest_lines: list[str]) -> list[str]:
    """`pytest -rs` SKIPPED lines other than those asking for more GPUs ("needs 2 GPUs")."""
    return [x for x in pytest_lines if x.startswith("SKIPPED") and not re.search(r"needs \d+ GPUs", x)]


def c_tests_cuda(ctx: Ctx) -> str:
    """Every test that is skipped without CUDA. A skip that remains must be one that asks for more GPUs than this
    machine has (e.g. context parallelism on 2 GPUs); any other skip means CUDA was not seen, and fails."""
    r = ctx.run([ctx.py, "-m", "pytest", "-m", "cuda", "-q", "-rs", "-p", "no:cacheprovider", "tests/"])
    lines = log_text(ctx).strip().splitlines()
    summary = next((x for x in reversed(lines) if " in " in x and ("passed" in x or "failed" in x)), "")
    if r.returncode != 0:
        raise CheckFailed(summary or f"pytest exited {r.returncode}")
    skips = [x for x in lines if x.startswith("SKIPPED")]
    unexpected = unexpected_skips(lines)
    if unexpected or "passed" not in summary:
        raise CheckFailed(f"CUDA tests skipped on a CUDA machine: {(unexpected or [summary])[0]}")
    return summary + (f" ({len(skips)} need more GPUs)" if skips else "")


def _train(name: str, *extra: str, expect: str, steps: int = 6):
    """A short run with `extra` settings; `expect` (a regex) must appear in its log, proving they took effect."""

    def fn(ctx: Ctx) -> str:
        rows = metrics(ctx.train(name, steps, *extra))
        if not re.search(expect, log_text(ctx)):
            raise CheckFailed(f"the run's log has no line matching {expect!r}")
        return f"loss {rows[1]:.4f} -> {rows[max(rows)]:.4f}"

    return fn


def _float8(recipe: str):
    def fn(ctx: Ctx) -> str:
        extra = ["--float8.enable=true", f"--float8.recipe={recipe}", F8_MIN_DIM]
        if ctx.cuda:
            extra.append("--compile.enable=true")  # float8 is meant to run compiled on a GPU
        rows = metrics(ctx.train(f"float8_{recipe}", 6, *extra))
        line = next((x for x in log_text(ctx).splitlines() if "converted" in x and "linears" in x), "")
        n = int(line.split("converted")[1].split()[0]) if line else 0
        if n == 0:
            raise CheckFailed("no linear layer was converted to float8 (filter skipped all)")
        return f"{n} float8 linears, loss {rows[1]:.4f} -> {rows[max(rows)]:.4f}"

    return fn


def _ckpt_args(ctx: Ctx) -> list[str]:
    det = ["--training.deterministic=true"] if ctx.cuda else []
    return [
        "--training.mixed_precision_param=float32",
        "--checkpoint.enable=true",
        "--checkpoint.interval=3",
        "--metrics.peak_tflops=1",
        *det,
    ]


def c_resume(ctx: Ctx) -> str:
    """An uninterrupted 6-step run saving at 3 and 6; a second run started from its step-3 checkpoint must log
    the same losses at steps 4-6 (bitwise: same device, same kernels, deterministic on CUDA)."""
    straight = ctx.train("ckpt_straight", 6, *_ckpt_args(ctx))
    resumed = ctx.out / "ckpt_resumed"
    shutil.rmtree(resumed, ignore_errors=True)
    shutil.copytree(straight / "checkpoint" / "step-3", resumed / "checkpoint" / "step-3")
    ctx.train("ckpt_resumed", 6, *_ckpt_args(ctx))
    ref, got = metrics(straight), metrics(resumed)
    if sorted(got) != [4, 5, 6]:
        raise CheckFailed(f"resumed run logged steps {sorted(got)}, expected [4, 5, 6]")
    diff = max(abs(got[s] - ref[s]) for s in got)
    if diff != 0.0:
        raise CheckFailed(f"resumed losses differ from the uninterrupted run's by up to {diff:.3g}")
    return "steps 4-6 identical to the uninterrupted run"


def c_async_twice(ctx: Ctx) -> str:
    args = [a for a in _ckpt_args(ctx) if not a.startswith("--training.deterministic")]
    dump = ctx.train("ckpt_async", 4, *args, "--checkpoint.interval=2", "--checkpoint.async_mode=async")
    from torchtitan.checkpoint import committed_checkpoints

    steps = sorted(committed_checkpoints(str(dump / "checkpoint")))
    if steps != [2, 4]:
        raise CheckFailed(f"committed async checkpoints {steps}, expected [2, 4]")
    return "async saves at steps 2 and 4 committed"


def c_hf_logits(ctx: Ctx) -> str:
    """Our step-6 checkpoint (from `resume`, else a fresh run) -> HF safetensors with scripts/convert_dcp_to_hf.py ->
    transformers' LlamaForCausalLM; its logits against our model's on the same weights and tokens, fp32."""
    ckpt = ctx.out / "ckpt_straight" / "checkpoint" / "step-6"
    if not ckpt.is_dir():
        ckpt = ctx.train("ckpt_straight", 6, *_ckpt_args(ctx)) / "checkpoint" / "step-6"
    hf = ctx.out / "hf_export"
    shutil.rmtree(hf, ignore_errors=True)
    r = ctx.run([ctx.py, "scripts/convert_dcp_to_hf.py", str(ckpt), str(hf), "--flavor", "debugmodel"])
    if r.returncode != 0:
        raise CheckFailed(f"convert_dcp_to_hf.py exited {r.returncode}")
    code = f"""
import torch, transformers
from torchtitan.checkpoint.hf import load_dcp_model
from torchtitan.models import build_model_args, get_model_class
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = "cuda" if {ctx.cuda} else "cpu"
args = build_model_args("llama3", "debugmodel")
ours = get_model_class("llama3")(args)
ours.load_state_dict(load_dcp_model({str(ckpt)!r}), strict=True)
ours = ours.to(dev).eval()
hf = transformers.LlamaForCausalLM.from_pretrained({str(hf)!r}, attn_implementation="eager").to(dev).eval()
tokens = torch.randint(0, args.vocab_size, (2, 64), generator=torch.Generator().manual_seed(0)).to(dev)
with torch.no_grad():
    diff = (ours(tokens).float() - hf(tokens).logits.float()).abs().max().item()
print(f"max abs logit difference {{diff:.3g}}")
raise SystemExit(0 if diff < (2e-3 if dev == "cuda" else 1e-4) else 1)
"""
    r = ctx.run([ctx.py, "-c", code])
    last = log_text(ctx).strip().splitlines()[-2]
    if r.returncode != 0:
        raise CheckFailed(last)
    return last + " (transformers vs ours, fp32)"


def c_profiler(ctx: Ctx) -> str:
    dump = ctx.train(
        "profiler",
        4,
        "--profiling.enable_profiling=true",
        "--profiling.profile_freq=2",
        "--metrics.peak_tflops=1",
    )
    traces = [p for p in (dump / "profile_traces").rglob("*") if p.is_file()]
    if not traces:
        raise CheckFailed(f"no trace file under {dump / 'profile_traces'}")
    return f"{len(traces)} trace file(s), e.g. {traces[0].name}"


def c_tb_memory(ctx: Ctx) -> str:
    """The device's memory in TensorBoard, read back with tensorboard's own reader: CUDA max reserved on a GPU,
    process RSS on CPU."""
    dump = ctx.train("tb_memory", 3, "--metrics.enable_tensorboard=true", "--metrics.peak_tflops=1")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tag = "memory/max_reserved_gib" if ctx.cuda else "memory/max_rss_gib"
    found = {}
    for events in (dump / "tb").rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events.parent))
        acc.Reload()
        if tag in acc.Tags().get("scalars", []):
            found = {e.step: e.value for e in acc.Scalars(tag)}
    if not found or max(found.values()) <= 0:
        raise CheckFailed(f"no positive {tag} scalar in {dump / 'tb'}")
    return f"{tag} = {max(found.values()):.2f} GiB over steps {sorted(found)}"


def c_sim64(ctx: Ctx) -> str:
    """One simulated rank of a 64-GPU FSDP layout (comm.mode=fake_backend, docs/launching.md)."""
    dump = ctx.train(
        "sim64",
        2,
        "--comm.mode=fake_backend",
        "--comm.fake_world_size=64",
        "--comm.fake_rank=5",
        "--parallelism.data_parallel_shard_degree=64",
        "--metrics.peak_tflops=1",
        losses=False,
    )
    sim = json.loads((dump / "simulation.json").read_text())
    if (sim.get("world_size"), sim.get("rank")) != (64, 5):
        raise CheckFailed(
            f"simulation.json says rank {sim.get('rank')} of {sim.get('world_size')}, expected 5 of 64"
        )
    peak = sim.get("measured_gib", {}).get("peak")
    return f"rank 5 of 64 on {sim.get('device')}, measured peak {peak} GiB"


def c_fsdp_gpus(ctx: Ctx) -> str:
    rows = metrics(ctx.train("fsdp2_gpus", 6, nproc=2))
    return f"FSDP over 2 GPUs (NCCL), loss {rows[1]:.4f} -> {rows[max(rows)]:.4f}"


CHECKS = [
    Check("tests-cuda", "pytest -m cuda (tests skipped without CUDA)", c_tests_cuda, cuda_only=True),
    Check("bf16", "6 steps, bf16 autocast", _train("bf16", expect=r"mixed precision: .*bfloat16")),
    Check(
        "fp32",
        "6 steps, fp32",
        _train("fp32", "--training.mixed_precision_param=float32", expect=r"mixed precision: none, fp32"),
    ),
    Check(
        "compile",
        "6 steps, torch.compile",
        _train("compile", "--compile.enable=true", expect=r"torch.compile: \d+ transformer blocks compiled"),
    ),
    Check("float8-tensorwise", "float8 tensorwise, converted layers present", _float8("tensorwise")),
    Check("float8-rowwise", "float8 rowwise, converted layers present", _float8("rowwise")),
    Check(
        "ac-full",
        "full activation checkpointing",
        _train("ac_full", "--activation_checkpoint.mode=full", expect=r"activation checkpointing \(full\)"),
    ),
    Check(
        "ac-selective-op",
        "selective AC, per-op policy",
        _train(
            "ac_sel_op",
            "--activation_checkpoint.mode=selective",
            "--activation_checkpoint.selective_ac_option=op",
            expect=r"activation checkpointing \(selective per-op\)",
        ),
    ),
    Check(
        "ac-selective-2",
        "selective AC, every 2nd block",
        _train(
            "ac_sel_2",
            "--activation_checkpoint.mode=selective",
            "--activation_checkpoint.selective_ac_option=2",
            expect=r"activation checkpointing \(every 2-th block\): blocks 1, 3, 5",
        ),
    ),
    Check("resume", "save at 3, resume: losses 4-6 equal the uninterrupted run's", c_resume),
    Check("async-save-twice", "two async checkpoint saves in one run", c_async_twice),
    Check("hf-logits", "DCP -> HF export, logits against transformers", c_hf_logits),
    Check("profiler", "torch.profiler trace written", c_profiler),
    Check("tb-memory", "device memory in TensorBoard (tensorboard's reader)", c_tb_memory),
    Check("sim-64", "simulated rank 5 of a 64-GPU FSDP layout (fake backend)", c_sim64),
    Check("fsdp-2gpu", "FSDP across 2 GPUs with NCCL", c_fsdp_gpus, cuda_only=True, min_gpus=2),
]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--cpu", action="store_true", help="run on CPU even if CUDA is present")
    mode.add_argument("--cuda", action="store_true", help="require CUDA (exit 2 without it)")
    p.add_argument("--only", default="", help="comma-separated check names (default: all)")
    p.add_argument("--out", default="outputs/gpu_check", help="folder for logs and run folders")
    p.add_argument("--list", action="store_true", help="list the checks and exit")
    a = p.parse_args(argv)
    if a.list:
        for c in CHECKS:
            print(f"{c.name:18s} {c.what}")
        return 0
    names = [n for n in a.only.split(",") if n]
    unknown = sorted(set(names) - {c.name for c in CHECKS})
    if unknown:
        print(
            f"error: --only: unknown check(s) {', '.join(unknown)} (valid: {', '.join(c.name for c in CHECKS)})",
            file=sys.stderr,
        )
        return 2

    import torch

    has_cuda = torch.cuda.is_available()
    if a.cuda and not has_cuda:
        print("error: --cuda given but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    cuda = has_cuda and not a.cpu
    gpus = torch.cuda.device_count() if cuda else 0
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    ctx = Ctx(out, cuda, gpus, sys.executable)
    where = f"{gpus} x {torch.cuda.get_device_name(0)}" if cuda else "CPU"
    print(f"gpu_check: torch {torch.__version__} on {where}; logs in {out}", flush=True)
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
    for c in CHECKS:
        if names and c.name not in names:
            continue
        ctx.log = out / f"{c.name}.log"
        ctx.log.write_text("")
        t0 = time.perf_counter()
        if c.cuda_only and not cuda:
            status, note = "SKIP", "needs CUDA"
        elif c.min_gpus and gpus < c.min_gpus:
            status, note = "SKIP", f"needs {c.min_gpus} GPUs, {gpus} present"
        else:
            try:
                status, note = "PASS", c.fn(ctx)
            except CheckFailed as e:
                status, note = "FAIL", str(e)
            except Exception as e:  # a check's own bug or an unexpected file layout: still one line
                status, note = "FAIL", f"{type(e).__name__}: {e}"
        counts[status] += 1
        log = str(ctx.log) if status != "SKIP" else "-"
        print(f"{status}  {c.name:18s} {time.perf_counter() - t0:7.1f} s  {log}  {note}", flush=True)
    print(f"gpu_check summary: {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped")
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
