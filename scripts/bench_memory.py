#!/usr/bin/env python
"""Activation memory and recompute of one transformer block on CPU: attention path and activation checkpointing.

    python scripts/bench_memory.py                                  # debug model shape, batch 8 x 256, fp32
    python scripts/bench_memory.py --flavor 8B --batch 1 --seq-len 512 --layers 1

For each variant, one block's forward runs under torch.profiler with profile_memory=True and the bytes still
allocated when forward returns (the net of every allocation and free the profiler recorded, the block's output
included) are what autograd keeps for backward: the activation memory of that block. FLOPs of forward +
backward come from torch.utils.flop_counter.FlopCounterMode (recomputation shows up as extra FLOPs).
Variants: K/V repeated (repeat_kv) or read natively by SDPA (enable_gqa), and the activation checkpointing
modes of torchtitan/parallel/activation_checkpoint.py. Works on the code it is run with, so running it on an
older checkout gives the before figures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from torchtitan.models.llama3 import Transformer, get_model_args  # noqa: E402
from torchtitan.parallel.activation_checkpoint import apply_ac  # noqa: E402

MIB = 2**20


def block_and_input(args, mode: str, option: str, native_gqa: bool | None, batch: int, seq_len: int):
    torch.manual_seed(0)
    model = Transformer(args)
    model.init_weights(0)
    if native_gqa is not None:
        for b in model.layers.values():
            b.attention.native_gqa = native_gqa
    apply_ac(model, mode, option)
    x = torch.randn(batch, seq_len, args.dim, requires_grad=True)
    return model.layers["0"], x, model.freqs_cis


def activation_bytes(block, x, freqs) -> int:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = block(x, freqs)
    del out  # counted above: the allocations stay in the record whatever happens to the tensor now
    return sum(e.self_cpu_memory_usage for e in prof.events())


def flops(block, x, freqs) -> int:
    with FlopCounterMode(display=False) as counter:
        block(x, freqs).sum().backward()
    return counter.get_total_flops()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--flavor", default="debugmodel")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--layers", type=int, default=None, help="build only this many layers (large flavors)")
    a = p.parse_args()
    overrides = {"max_seq_len": a.seq_len}
    if a.layers:
        overrides["n_layers"] = a.layers
    args = get_model_args(a.flavor, **overrides)
    has_gqa_switch = hasattr(Transformer(get_model_args("debugmodel")).layers["0"].attention, "native_gqa")
    variants = [("none", "op", None)]
    if has_gqa_switch:
        variants = [("none", "op", False), ("none", "op", True)]
    variants += [("full", "op", None), ("selective", "2", None), ("selective", "op", None)]
    print(
        f"{a.flavor}, batch {a.batch} x {a.seq_len}, fp32, one block (n_rep {args.n_heads // args.n_kv_heads})"
    )
    print(f"{'variant':<34} {'activations MiB':>16} {'fwd+bwd GFLOP':>14}")
    for mode, option, gqa in variants:
        name = f"AC {mode}" + (f" {option}" if mode == "selective" else "")
        if gqa is not None:
            name += ", native GQA" if gqa else ", repeat_kv"
        block, x, freqs = block_and_input(args, mode, option, gqa, a.batch, a.seq_len)
        kept = activation_bytes(block, x, freqs)
        gflop = flops(block, x, freqs) / 1e9
        print(f"{name:<34} {kept / MIB:>16.1f} {gflop:>14.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
