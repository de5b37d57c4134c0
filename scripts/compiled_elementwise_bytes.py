#!/usr/bin/env python
"""Bytes a compiled transformer block's own kernels move per token, by Inductor's count (CPU), against the estimator's
hand count for compiled blocks (steptime.elementwise_bytes).

    python scripts/compiled_elementwise_bytes.py                      # 8B block shape, no AC / per-op SAC / full AC
    python scripts/compiled_elementwise_bytes.py --flavor 1B --ac op --kernels
    python scripts/compiled_elementwise_bytes.py --device cuda     # Triton's kernels, on a GPU

One block of torchtitan/models/llama3 at the flavor's widths, in bf16 (FSDP's parameter and activation dtype), is
wrapped by this trainer's activation checkpointing and compiled in place as the trainer compiles it
(torchtitan/parallel/compile.py), then run forward and backward. Every graph Inductor lowers is read after code
generation: each scheduler node's bytes (`get_read_write_buffers_sizes`, what Inductor's own `count_bytes` metric
sums: the buffers a kernel reads and writes, intermediates fused away). Nodes are split into Inductor's generated
kernels (the elementwise and reduction work the estimator prices by bytes) and extern kernels (matmuls, attention:
priced on their FLOPs). Measured at two sequence lengths; the per-token slope is reported, forward graph and backward
graph (which holds the recompute under AC).

On a CPU (the default), CPU stands in for the GPU: the graphs and the partitioner's recompute choices are the same, but the C++ backend's
fusion differs from Triton's in places (it keeps RoPE's fp32 result and the attention input's layout copy as two
kernels, and has no mix-order reduction for the norms' backward, which Triton gained in 2025). So the figure is an
upper bound of what a recent GPU build moves, and about what older ones did; docs/estimate_log.md, "Compiled blocks'
elementwise bytes by Inductor's count", records the comparison and why it does not change the estimate.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch._functorch.config as functorch_config  # noqa: E402
import torch._inductor.config as inductor_config  # noqa: E402
from torch._inductor import scheduler  # noqa: E402
from torch._inductor.graph import GraphLowering  # noqa: E402

from torchtitan.config.manager import parse_args  # noqa: E402
from torchtitan.estimate.activations import recomputes_elementwise  # noqa: E402
from torchtitan.estimate.plan import build_plan  # noqa: E402
from torchtitan.estimate.steptime import elementwise_bytes  # noqa: E402
from torchtitan.models.llama3 import get_model_args  # noqa: E402
from torchtitan.models.llama3.model import TransformerBlock, precompute_freqs_cis  # noqa: E402
from torchtitan.parallel.activation_checkpoint import _wrap  # noqa: E402


def block_bytes(flavor: str, ac: str, seq: int, device: str = "cpu") -> list[tuple[bool, bool, str, int]]:
    """Every scheduler node of one compiled block's forward and backward graphs at `seq` tokens: (backward graph,
    generated kernel, name, bytes read and written)."""
    seen: list[tuple[bool, bool, str, int]] = []
    codegen = GraphLowering.codegen

    def recording_codegen(self, *args, **kwargs):
        out = codegen(self, *args, **kwargs)
        for node in self.scheduler.nodes:
            if isinstance(node, scheduler.NopKernelSchedulerNode):
                continue
            extern = isinstance(node, scheduler.ExternKernelSchedulerNode)
            name = str(getattr(node.node, "python_kernel_name", None)) if extern else node.get_name()
            seen.append((self.is_backward, not extern, name, int(node.get_read_write_buffers_sizes())))
        return out

    torch._dynamo.reset()
    args = get_model_args(flavor, max_seq_len=seq)
    torch.manual_seed(0)
    block = TransformerBlock(0, args).to(device=device, dtype=torch.bfloat16)
    if ac != "none":
        block = _wrap(block, per_op=(ac == "op"))
    block.compile()
    x = torch.randn(1, seq, args.dim, device=device, dtype=torch.bfloat16, requires_grad=True)
    # a cache hit skips code generation, and the nodes with it
    with (
        mock.patch.object(GraphLowering, "codegen", recording_codegen),
        inductor_config.patch(fx_graph_cache=False),
        functorch_config.patch(enable_autograd_cache=False),
    ):
        y = block(x, precompute_freqs_cis(args).to(device))
        y.backward(torch.randn_like(y))
    torch._dynamo.reset()
    return seen


def per_token(flavor: str, ac: str, seqs=(256, 512), device: str = "cpu") -> tuple[dict, list]:
    """{(backward, generated): bytes per token} from the slope between two lengths, and the longer run's nodes."""
    runs = [block_bytes(flavor, ac, s, device) for s in seqs]
    totals = []
    for nodes in runs:
        t = defaultdict(int)
        for bwd, generated, _, n in nodes:
            t[(bwd, generated)] += n
        totals.append(t)
    slope = {k: (totals[1][k] - totals[0][k]) / (seqs[1] - seqs[0]) for k in totals[1]}
    return slope, runs[1]


def hand_count(flavor: str, ac: str) -> tuple[float, float]:
    """The estimator's (forward, backward + recompute) bytes per token of a compiled block of this flavor."""
    mode = {"none": "none", "op": "selective", "full": "full"}[ac]
    argv = [f"--model.flavor={flavor}", "--compile.enable=true", f"--activation_checkpoint.mode={mode}"]
    fwd, bwd = elementwise_bytes(build_plan(parse_args(argv)))
    return fwd, bwd + (fwd if recomputes_elementwise(ac) else 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flavor", default="8B")
    ap.add_argument("--ac", choices=("none", "op", "full", "all"), default="all")
    ap.add_argument("--kernels", action="store_true", help="list the generated kernels of the longer run")
    ap.add_argument(
        "--device", default="cpu", help="cpu (Inductor's C++ kernels) or cuda (its Triton kernels)"
    )
    a = ap.parse_args()
    for ac in ("none", "op", "full") if a.ac == "all" else (a.ac,):
        slope, nodes = per_token(a.flavor, ac, device=a.device)
        fwd, bwd = slope.get((False, True), 0.0), slope.get((True, True), 0.0)
        h_fwd, h_bwd = hand_count(a.flavor, ac)
        print(f"{a.flavor} {a.device} ac={ac}: Inductor's kernels {fwd:,.0f} B/token forward, {bwd:,.0f} backward (with recompute),"
              f" {fwd + bwd:,.0f} in all; the estimator's compiled count {h_fwd:,.0f} / {h_bwd:,.0f} / {h_fwd + h_bwd:,.0f}"
              f" ({(fwd + bwd) / (h_fwd + h_bwd) - 1:+.1%})")  # fmt: skip
        if a.kernels:
            for bwd_graph, generated, name, n in nodes:
                if generated:
                    print(f"    {'backward' if bwd_graph else 'forward '} {name:32s} {n:>14,d} bytes")


if __name__ == "__main__":
    main()
