#!/usr/bin/env python
"""Which weight casts a compiled block of this trainer does under autocast, graph by graph (CPU).

    python scripts/compiled_weight_casts.py            # no AC and per-op SAC

One block (the debug model's widths, 48 tokens so that no activation has a weight's shape) is wrapped as the
trainer wraps it (torchtitan/parallel/activation_checkpoint.py), compiled with AOTAutograd and the partitioner
Inductor uses (min-cut rematerialization, compiler="inductor"), and run forward + backward under
torch.autocast(bf16) with fp32 parameters, as one process of the trainer runs (parallel/mixed_precision.py). In the
forward and backward graphs the partitioner chose, every dtype conversion (prims.convert_element_type /
aten._to_copy) of a tensor with a weight's shape is counted: fp32 -> bf16 (a weight cast to feed a matmul) and
bf16 -> fp32 (a weight gradient converted to the fp32 parameter's dtype). Inductor may fuse such a conversion with
other pointwise work, but it cannot fuse it into the matmul (an extern kernel on CPU and CUDA), so each reads the
fp32 (bf16) tensor and writes the bf16 (fp32) one: 6 bytes per parameter.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from functorch.compile import make_boxed_func, min_cut_rematerialization_partition  # noqa: E402
from torch._dynamo.backends.common import aot_autograd  # noqa: E402

from torchtitan.models.llama3 import get_model_args  # noqa: E402
from torchtitan.models.llama3.model import TransformerBlock, precompute_freqs_cis  # noqa: E402
from torchtitan.parallel.activation_checkpoint import _wrap  # noqa: E402

_CASTS = {torch.ops.prims.convert_element_type.default, torch.ops.aten._to_copy.default}


def weight_casts(ac: str, seq: int = 48) -> tuple[dict[str, dict[str, int]], int]:
    """({graph: {"to_bf16": elements, "to_fp32": elements}} of weight-shaped conversions, the block's linear
    weight elements)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    args = get_model_args("debugmodel", max_seq_len=seq)
    block = TransformerBlock(0, args)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.02)
    weights = {tuple(m.weight.shape) for m in block.modules() if isinstance(m, torch.nn.Linear)}
    n_weights = sum(m.weight.numel() for m in block.modules() if isinstance(m, torch.nn.Linear))
    if ac != "none":
        block = _wrap(block, per_op=(ac == "op"))
    seen: dict[str, dict[str, int]] = {}

    def recorder(name: str):
        def compile_fn(gm: torch.fx.GraphModule, example_inputs):
            counts = seen.setdefault(name, {"to_bf16": 0, "to_fp32": 0})
            for node in gm.graph.nodes:
                if node.op != "call_function" or node.target not in _CASTS:
                    continue
                src, out = node.args[0].meta.get("val"), node.meta.get("val")
                if src is None or out is None or tuple(src.shape) not in weights:
                    continue
                if src.dtype == torch.float32 and out.dtype == torch.bfloat16:
                    counts["to_bf16"] += src.numel()
                elif src.dtype == torch.bfloat16 and out.dtype == torch.float32:
                    counts["to_fp32"] += src.numel()
            return make_boxed_func(gm.forward)

        return compile_fn

    backend = aot_autograd(
        fw_compiler=recorder("forward"),
        bw_compiler=recorder("backward"),
        partition_fn=functools.partial(min_cut_rematerialization_partition, compiler="inductor"),
    )
    compiled = torch.compile(block, backend=backend)
    freqs = precompute_freqs_cis(args)
    x = torch.randn(1, seq, args.dim, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = compiled(x, freqs)
    y.backward(torch.randn_like(y))
    return seen, n_weights


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ac", action="append", choices=["none", "op", "full"], help="default none and op")
    a = p.parse_args()
    for ac in a.ac or ["none", "op"]:
        seen, n = weight_casts(ac)
        print(f"## AC {ac}: weight-shaped conversions, in units of the block's {n:,} linear weight elements")
        for graph, c in seen.items():
            print(f"{graph:9s} fp32->bf16 {c['to_bf16'] / n:.2f}   bf16->fp32 {c['to_fp32'] / n:.2f}")


if __name__ == "__main__":
    main()
