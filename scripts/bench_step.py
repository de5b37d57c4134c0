#!/usr/bin/env python
"""Where one training step's time goes, one process: forward, backward, clipping, AdamW step, per step.

    python scripts/bench_step.py --model.flavor=1B --model.vocab_size=2048 --training.seq_len=64 \\
        --training.local_batch_size=1
    python scripts/bench_step.py ... --optimizer.implementation=foreach      # the other AdamW kernel
    python scripts/bench_step.py ... --training.mixed_precision_param=float32

Arguments are the trainer's config overrides (train_configs/debug_model.toml first). The model is built and
initialized as the trainer does in one process (fp32 parameters, bf16 autocast when the config asks for bf16
parameters), AdamW is the trainer's (torchtitan.optim, state allocated before step 1), clipping is
torchtitan.optim.clip_grad_norm_; random tokens. Prints one line per step: seconds per phase, wall-clock
(the phases run on the CPU synchronously; on CUDA each phase ends with a synchronize). Step 1 also pays the
first touch of gradients and temporaries; later steps show the steady state.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from torchtitan.config import parse_args  # noqa: E402
from torchtitan.errors import UserError  # noqa: E402
from torchtitan.loss import cross_entropy_loss  # noqa: E402
from torchtitan.models import get_model_class, model_args_from_config  # noqa: E402
from torchtitan.optim import build_optimizer, clip_grad_norm_, init_optimizer_state  # noqa: E402
from torchtitan.parallel import pick_device  # noqa: E402
from torchtitan.runtime_env import set_env_defaults  # noqa: E402


def main(argv: list[str]) -> int:
    if "--help" in argv or "-h" in argv:
        print(__doc__.strip() + "\n\nThe trainer's options: python train.py --help")
        return 0
    steps = 3
    try:
        cfg = parse_args(["--job.config_file=train_configs/debug_model.toml", *argv])
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    t = cfg.training
    device = pick_device()
    args = model_args_from_config(cfg.model, t.seq_len)
    set_env_defaults(cfg, device.type, args.largest_weight_bytes())  # the trainer's (CPU: malloc reuse)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with torch.device("meta"):
        model = get_model_class(cfg.model.name)(args)
    model.to_empty(device=device)
    start = time.perf_counter()
    model.init_weights(t.seed)
    print(f"init {time.perf_counter() - start:.2f} s", flush=True)
    optimizer = build_optimizer([model], cfg)
    start = time.perf_counter()
    init_optimizer_state(optimizer)
    print(f"optimizer state {time.perf_counter() - start:.2f} s ({cfg.optimizer.implementation})", flush=True)
    bf16 = t.mixed_precision_param == "bfloat16"
    shape = (t.local_batch_size, t.seq_len)
    tokens = torch.randint(0, args.vocab_size, shape, device=device)
    labels = torch.randint(0, args.vocab_size, shape, device=device)
    marks: list[float] = []

    def mark():
        sync()
        marks.append(time.perf_counter())

    for step in range(1, steps + 1):
        marks.clear()
        marks.append(time.perf_counter())
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(tokens)
        loss = cross_entropy_loss(logits, labels, labels.numel())
        mark()
        loss.backward()
        mark()
        clip_grad_norm_(list(model.parameters()), t.max_norm)
        mark()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mark()
        phases = zip(("forward", "backward", "clip", "optimizer"), marks, marks[1:])
        line = "  ".join(f"{name} {b - a:.2f} s" for name, a, b in phases)
        print(f"step {step}  {line}  total {marks[-1] - marks[0]:.2f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
