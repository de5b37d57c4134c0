#!/usr/bin/env python
"""One transformer block's activation memory, FLOPs and time: attention paths and activation checkpointing.

    python scripts/bench_memory.py                             # debug model shape, batch 8 x 256, CPU fp32
    python scripts/bench_memory.py --dtype bfloat16
    python scripts/bench_memory.py --flavor 8B --batch 1 --seq-len 512 --layers 1
    python scripts/bench_memory.py --device cuda --dtype bfloat16 --flavor 8B --batch 1 --seq-len 8192 --layers 1

Only the transformer blocks are built (no embedding, final norm or output, as a middle pipeline stage), on the
device, and initialized with Transformer.init_weights; the first block is measured, in --dtype (the RoPE table
stays fp32). Activation memory is what autograd keeps for backward when the block's forward returns, the
block's output included. On CPU, forward runs under torch.profiler with profile_memory=True and it is the net
of every allocation and free the profiler recorded; on CUDA it is torch.cuda.memory_allocated() after forward
minus before, and the peak column is torch.cuda.max_memory_allocated() during forward + backward minus the
memory allocated before it (a warm-up pass has already allocated the block's gradients). FLOPs of forward +
backward come from torch.utils.flop_counter.FlopCounterMode (recomputation shows up as extra FLOPs; it has no
formula for the CPU attention kernel, so the CPU figures leave attention out). The time is the median of
--repeat forward + backward passes after 2 warm-ups (printed only: it depends on the machine).
Variants: K/V repeated (repeat_kv) or read natively by SDPA (enable_gqa), the activation checkpointing modes
of torchtitan/parallel/activation_checkpoint.py, and its per-op policy as it was before every second matmul
was recomputed. On CUDA, SDPA's flash kernel takes fp16/bf16 only, so fp32 runs another kernel: compare
repeat_kv and native GQA in bf16, as training runs. Works on the code it is run with, so running it on an
older checkout gives the before figures.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from torchtitan.models.llama3 import Transformer, get_model_args  # noqa: E402
from torchtitan.parallel import activation_checkpoint  # noqa: E402
from torchtitan.parallel.activation_checkpoint import apply_ac  # noqa: E402

MIB = 2**20


@contextlib.contextmanager
def every_matmul_saved():
    """The per-op policy as it was before every second matmul was recomputed, for the before/after figure.

    _save_policy reads the module global _MATMULS when it runs; with it empty no op counts as a matmul to
    recompute, and since the matmuls are in SAVE_OPS all their outputs are saved: the previous policy.
    """
    matmuls = activation_checkpoint._MATMULS
    activation_checkpoint._MATMULS = set()
    try:
        yield
    finally:
        activation_checkpoint._MATMULS = matmuls


def block_and_input(args, mode: str, option: str, native_gqa: bool | None, a):
    device, dtype = torch.device(a.device), getattr(torch, a.dtype)
    with torch.device("meta"):
        model = Transformer(args)
    model.tok_embeddings = model.norm = model.output = None  # only the blocks are measured
    model.to_empty(device=device)
    model.init_weights(0)
    if native_gqa is not None:
        for b in model.layers.values():
            b.attention.native_gqa = native_gqa
    apply_ac(model, mode, option)
    torch.manual_seed(0)
    x = torch.randn(a.batch, a.seq_len, args.dim, device=device, dtype=dtype, requires_grad=True)
    return model.layers["0"].to(dtype), x, model.freqs_cis


def fwd_bwd(block, x, freqs) -> None:
    block(x, freqs).sum().backward()


def activation_bytes(block, x, freqs) -> int:
    if x.device.type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        out = block(x, freqs)
        torch.cuda.synchronize()
        kept = torch.cuda.memory_allocated() - before
        del out
        return kept
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = block(x, freqs)
    del out  # counted above: the allocations stay in the record whatever happens to the tensor now
    return sum(e.self_cpu_memory_usage for e in prof.events())


def peak_bytes(block, x, freqs) -> int:
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fwd_bwd(block, x, freqs)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def flops(block, x, freqs) -> int:
    with FlopCounterMode(display=False) as counter:
        fwd_bwd(block, x, freqs)
    return counter.get_total_flops()


def median_ms(block, x, freqs, repeat: int) -> float:
    sync = torch.cuda.synchronize if x.device.type == "cuda" else (lambda: None)
    for _ in range(2):
        fwd_bwd(block, x, freqs)
    times = []
    for _ in range(repeat):
        sync()
        start = time.perf_counter()
        fwd_bwd(block, x, freqs)
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--flavor", default="debugmodel")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--layers", type=int, default=None, help="build only this many layers (large flavors)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--repeat", type=int, default=None, help="timed passes (default: 5 on cuda, 3 on cpu)")
    a = p.parse_args()
    repeat = a.repeat or (5 if a.device == "cuda" else 3)
    cuda = a.device == "cuda"
    overrides = {"max_seq_len": a.seq_len}
    if a.layers:
        overrides["n_layers"] = a.layers
    args = get_model_args(a.flavor, **overrides)
    has_gqa_switch = hasattr(Transformer(get_model_args("debugmodel")).layers["0"].attention, "native_gqa")
    # (mode, selective option, native GQA or None for the default, the previous per-op policy)
    variants = [("none", "op", None, False)]
    if has_gqa_switch:
        variants = [("none", "op", False, False), ("none", "op", True, False)]
    variants += [
        ("full", "op", None, False),
        ("selective", "2", None, False),
        ("selective", "op", None, False),
    ]
    if hasattr(activation_checkpoint, "_MATMULS"):  # older checkouts save every matmul already
        variants.append(("selective", "op", None, True))
    print(
        f"{a.flavor}, batch {a.batch} x {a.seq_len}, {a.device} {a.dtype}, one block"
        f" (n_rep {args.n_heads // args.n_kv_heads}), median of {repeat} timed passes"
    )
    peak_col = f" {'peak fwd+bwd MiB':>17}" if cuda else ""
    print(f"{'variant':<36} {'activations MiB':>16}{peak_col} {'fwd+bwd GFLOP':>14} {'fwd+bwd ms':>11}")
    for mode, option, gqa, previous in variants:
        name = f"AC {mode}" + (f" {option}" if mode == "selective" else "")
        if gqa is not None:
            name += ", native GQA" if gqa else ", repeat_kv"
        if previous:
            name += ", every matmul saved"
        with every_matmul_saved() if previous else contextlib.nullcontext():
            block, x, freqs = block_and_input(args, mode, option, gqa, a)
            fwd_bwd(block, x, freqs)  # one-time allocations (CUDA library workspaces, the gradients) go first
            kept = activation_bytes(block, x, freqs)
            peak = f" {peak_bytes(block, x, freqs) / MIB:>17.1f}" if cuda else ""
            gflop = flops(block, x, freqs) / 1e9
            ms = median_ms(block, x, freqs, repeat)
        print(f"{name:<36} {kept / MIB:>16.1f}{peak} {gflop:>14.2f} {ms:>11.1f}")
        del block, x, freqs
    return 0


if __name__ == "__main__":
    sys.exit(main())
