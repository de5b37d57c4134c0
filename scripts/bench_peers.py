#!/usr/bin/env python
"""This trainer vs Hugging Face transformers' LlamaForCausalLM: same shape, batch, data, threads and optimizer.

    python scripts/bench_peers.py                                     # debug shape, bf16 and fp32, 3 pairs each
    python scripts/bench_peers.py --flavor debugmodel_large --batch 2 --dtype float32 --repeat 5
    python scripts/bench_peers.py -- --compile.enable=true          # both sides torch.compile'd (blocks + loss)
    python scripts/bench_peers.py --flavor 1B --batch 2 --seq-len 8192 --dtype bfloat16 --steps 30 --interval 5 \
        --warmup 10 --repeat 2 -- --model.tokenizer_path=/tmp/tok/tokenizer.json   # on a GPU (see below)

Runs alternate (trainer, HF, trainer, HF, ...) so drift in machine speed hits both alike, and the ratio
trainer / HF is taken per pair; the median is printed with every pair's figure. Each side runs in its own
process with the same OMP_NUM_THREADS (default: all cores), one process each. Where CUDA is available both
run on the GPU (one device, bf16 autocast over fp32 weights on both sides); the 1B-8B flavors need a tokenizer
of Llama 3's vocabulary size (scripts/make_bench_tokenizer.py). Peak memory is printed for both sides (RSS on
CPU, the caching allocator's max reserved on CUDA, as scripts/bench.py).

What each side runs:
  trainer  `python train.py` (train_configs/debug_model.toml + the flavor, batch and dtype given here), measured
           by its own metrics (tokens/s per device, median over `--interval`-step intervals after `--warmup`).
  HF       LlamaForCausalLM (attn_implementation="sdpa": its default, SDPA's fused attention kernels)
           built from the same ModelArgs (torchtitan.checkpoint.hf) and loaded with the trainer's initial
           weights, fed the trainer's data stream; the loop a user writes: forward under
           torch.autocast(bfloat16) for bf16 (what HF's Trainer does with bf16=True), logits upcast to fp32 for
           the cross-entropy, backward, torch.nn.utils.clip_grad_norm_ (max_norm from the config), torch AdamW
           with the config's lr/betas/eps/weight decay on the same parameters (matrices but not embeddings
           decayed, as the trainer does) and the trainer's AdamW kernel (optimizer.implementation; HF's Trainer
           defaults to the fused one too), zero_grad(set_to_none). Constant LR (the trainer's schedule costs
           nothing measurable). Timed like scripts/bench.py's bare loop. With `-- --compile.enable=true` each
           decoder layer is compiled in place and the loss too, as the trainer compiles its blocks and loss.
Both start from the same weights and see the same tokens, so their first losses agree (printed as a check).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench import CONFIG, IntervalMeter, trainer  # noqa: E402

from torchtitan.launch import local_command  # noqa: E402

TARGETS = {"bfloat16": 1.15, "float32": 1.05}  # issue 10's targets on the 2-core CPU (none set for GPUs)


def hf_worker(out: str, steps: int, interval: int, warmup: int, overrides: list[str]) -> None:
    """The Hugging Face loop (see the module docstring); writes its figures to `out` as JSON."""
    import torch
    import torch.nn.functional as F
    import transformers

    from torchtitan.checkpoint.hf import hf_config_from_model_args, ours_to_hf
    from torchtitan.config import parse_args
    from torchtitan.data import build_dataloader, build_tokenizer
    from torchtitan.models import get_model_class, model_args_from_config
    from torchtitan.parallel.compile import maybe_compile_loss

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = parse_args([CONFIG, *overrides])
    t, o = cfg.training, cfg.optimizer
    torch.manual_seed(t.seed)
    args = model_args_from_config(cfg.model, t.seq_len)
    ours = get_model_class(cfg.model.name)(args)
    ours.init_weights(t.seed)
    hf_cfg = transformers.LlamaConfig(**hf_config_from_model_args(args), attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(hf_cfg)
    model.load_state_dict(ours_to_hf(ours.state_dict(), args), strict=True)
    del ours
    model.to(device).train()
    c = cfg.compile
    if c.enable and "model" in c.components:  # as the trainer does: each decoder layer compiled in place
        for layer in model.model.layers:
            layer.compile()

    def loss_fn(logits, labels):
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())

    loss_fn = maybe_compile_loss(loss_fn, cfg, device.type)  # the trainer's rule for compiling its loss
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed_tokens" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed_tokens" not in n)]
    impl = {"foreach": {"foreach": True}, "fused": {"fused": True}, "for-loop": {"foreach": False}}
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=o.lr,
        betas=(o.beta1, o.beta2),
        eps=o.eps,
        **impl[o.implementation],
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
    bf16 = t.mixed_precision_param == "bfloat16"
    meter, first_loss = IntervalMeter(device, interval, warmup, t.local_batch_size * t.seq_len), None
    for step in range(1, steps + 1):
        x, y = (b.to(device) for b in next(data))
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=x, use_cache=False).logits
        loss = loss_fn(logits, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.max_norm, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step == 1:
            first_loss = loss.item()
        meter.after_step(step, loss)
    with open(out, "w") as f:
        json.dump({**meter.result(), "first_loss": first_loss}, f)


def hf(steps: int, interval: int, warmup: int, overrides: list[str], env: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "hf.json")
        worker = [f"--hf-worker={out}", f"--steps={steps}", f"--interval={interval}", f"--warmup={warmup}"]
        cmd = [*local_command(1, str(Path(__file__).resolve())), *worker, "--", *overrides]
        subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            return json.load(f)


def first_trainer_loss(overrides: list[str], env: dict) -> float:
    """Loss of the trainer's step 1 (same weights and tokens as the HF run's step 1)."""
    with tempfile.TemporaryDirectory() as dump:
        args = [
            CONFIG,
            "--training.steps=1",
            "--metrics.enable_tensorboard=false",
            "--job.print_config=false",
        ]
        cmd = [*local_command(1, str(ROOT / "train.py")), *args, *overrides, f"--job.dump_folder={dump}"]
        subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(dump, "metrics.jsonl")) as f:
            return json.loads(f.readline())["loss/global_avg"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--flavor", default="debugmodel", help="model flavor for both (debugmodel, debugmodel_large)"
    )
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--dtype", choices=["bfloat16", "float32", "both"], default="both")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="OMP_NUM_THREADS for both")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--interval", type=int, default=5)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeat", type=int, default=3, help="alternating (trainer, HF) pairs per dtype")
    p.add_argument("--hf-worker", help=argparse.SUPPRESS)  # internal: run the HF loop, write JSON here
    p.add_argument("overrides", nargs="*", help="extra config overrides after --, applied to both")
    a = p.parse_args()
    if a.hf_worker:
        hf_worker(a.hf_worker, a.steps, a.interval, a.warmup, a.overrides)
        return 0
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS=str(a.threads))
    os.environ.update(OMP_NUM_THREADS=str(a.threads))  # trainer() inherits this process's environment
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"cpu, {a.threads} threads"
    result = {"flavor": a.flavor, "batch": f"{a.batch} x {a.seq_len}", "device": device}
    for dtype in ["bfloat16", "float32"] if a.dtype == "both" else [a.dtype]:
        overrides = [
            f"--model.flavor={a.flavor}",
            f"--training.local_batch_size={a.batch}",
            f"--training.seq_len={a.seq_len}",
            f"--training.mixed_precision_param={dtype}",
            *a.overrides,
        ]
        ours, theirs = [], []
        for _ in range(a.repeat):
            ours.append(trainer(1, a.steps, a.interval, a.warmup, overrides))
            theirs.append(hf(a.steps, a.interval, a.warmup, overrides, env))
        rate = "tokens_per_sec_per_device"
        ratios = [x[rate] / y[rate] for x, y in zip(ours, theirs)]
        result[dtype] = {
            "trainer_tokens_per_sec": round(statistics.median(x[rate] for x in ours)),
            "hf_tokens_per_sec": round(statistics.median(y[rate] for y in theirs)),
            "trainer_over_hf_median": round(statistics.median(ratios), 4),
            "trainer_over_hf_runs": [round(r, 4) for r in ratios],
            "target": TARGETS[dtype],
            "peak_memory_gib_trainer_hf": [
                round(max(x["peak_memory_gib"] for x in ours), 2),
                round(max(y["peak_memory_gib"] for y in theirs), 2),
            ],
            "first_loss_trainer_hf": [
                round(first_trainer_loss(overrides, env), 4),
                round(theirs[0]["first_loss"], 4),
            ],
        }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
