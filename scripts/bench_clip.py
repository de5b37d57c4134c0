#!/usr/bin/env python
"""Gradient-norm clipping time on a flavor's parameter shapes: torchtitan's, the previous fp64 one, torch's.

    python scripts/bench_clip.py --device cuda --flavor 8B
    python scripts/bench_clip.py --flavor 1B --layers 2 --repeat 3      # CPU, 2 of the 16 blocks

One process, no torch.distributed: every parameter of the flavor (the shapes of a model built on the meta
device) becomes a plain tensor on --device with a random normal gradient in --dtype. Three ways of clipping
them to their global L2 norm run in turn, --repeat rounds, and each one's median time is printed:
  torchtitan.optim.clip_grad_norm_                   the current code (norms without fp64 copies)
  fp64 copies (previous)                             the previous code: each gradient's norm over an fp64 copy
                                                     (torch.linalg.vector_norm(g, dtype=torch.float64)), then
                                                     clip_grads_with_norm_'s torch._foreach_mul_ scaling
  torch.nn.utils.clip_grad_norm_(foreach=True)       reference
A first call of each with max_norm=inf (scale 1, the gradients stay as they are) gives the norm of the same
gradients and its relative difference from the fp64 one. torch's reference reduces each tensor in the
gradients' dtype, on CPU nearly sequentially, so there it drifts with tensor size (fp32: 1e-6 on the debug
model, 3e-2 on 1B's 262M-element embedding; bf16: 3e-3). The timed calls then use max_norm = half that norm:
the first call halves the gradients, later ones find the norm at max_norm and scale by ~1. Each method
multiplies every gradient by its clamped coefficient whatever its value, so the work is the same every call,
and unlike a fixed max_norm of 1.0 the gradients do not shrink call after call into denormals (slow on CPU).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from torchtitan.models.llama3 import Transformer, get_model_args  # noqa: E402
from torchtitan.optim import clip_grad_norm_  # noqa: E402


@torch.no_grad()
def previous_clip_grad_norm_(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """The previous torchtitan.optim.clip_grad_norm_ for plain tensors: an fp64 copy of every gradient."""
    norms = [torch.linalg.vector_norm(p.grad, dtype=torch.float64) for p in params]
    total = torch.stack(norms).square().sum().sqrt().float()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach=True)
    return total


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--flavor", default="1B")
    p.add_argument("--layers", type=int, default=None, help="override the flavor's n_layers")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="of the gradients")
    p.add_argument("--repeat", type=int, default=10)
    a = p.parse_args()
    device, dtype = torch.device(a.device), getattr(torch, a.dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    overrides = {"n_layers": a.layers} if a.layers else {}
    with torch.device("meta"):
        shapes = [w.shape for w in Transformer(get_model_args(a.flavor, **overrides)).parameters()]
    torch.manual_seed(0)
    params = []
    for shape in shapes:
        param = torch.empty(shape, device=device, dtype=dtype)  # its values are never read
        param.grad = torch.randn(shape, device=device, dtype=dtype)
        params.append(param)
    methods = {
        "torchtitan.optim.clip_grad_norm_": lambda m: clip_grad_norm_(params, m),
        "fp64 copies (previous)": lambda m: previous_clip_grad_norm_(params, m),
        "torch.nn.utils.clip_grad_norm_(foreach=True)": lambda m: torch.nn.utils.clip_grad_norm_(
            params, m, foreach=True
        ),
    }
    norms = {name: float(clip(math.inf)) for name, clip in methods.items()}
    reference = norms["fp64 copies (previous)"]
    max_norm = reference / 2
    times = {name: [] for name in methods}
    for i in range(a.repeat + 1):  # round 0 is a warm-up
        for name, clip in methods.items():
            sync()
            start = time.perf_counter()
            clip(max_norm)
            sync()
            if i:
                times[name].append(time.perf_counter() - start)
    elements = sum(math.prod(s) for s in shapes)
    model = a.flavor + (f" ({a.layers} layers)" if a.layers else "")
    print(
        f"{model}: {len(shapes)} parameters, {elements:,} elements, {a.device} {a.dtype} gradients;"
        f" max_norm {max_norm:.1f}, median of {a.repeat}"
    )
    print(f"{'method':<46} {'median ms':>10} {'norm (first call)':>18} {'rel. diff':>10}")
    for name in methods:
        ms = statistics.median(times[name]) * 1e3
        diff = abs(norms[name] - reference) / reference
        print(f"{name:<46} {ms:>10.2f} {norms[name]:>18.3f} {diff:>10.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
