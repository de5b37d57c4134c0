#!/usr/bin/env python
"""The collectives one transformer block's forward and backward run under two TP plans, counted on 2 CPU ranks.

    python scripts/tp_plan_collectives.py                  # every case: plan x sequence parallel x eager/compiled
    python scripts/tp_plan_collectives.py --cases linear-sp-eager,module-sp-eager

The estimator prices a block's TP collectives by count (steptime.tp_block_comm). Plans differ in where they
redistribute the attention's and the MLP's input:
  module  PrepareModuleInput at the attention and the MLP (this trainer's parallel/tensor.py, torchtitan's): one
          collective for wq, wk, wv and one for w1, w3
  linear  ColwiseParallel on each of q, k, v, gate and up with its own input layout and no PrepareModuleInput
          (KempnerForge's kempnerforge/distributed/tensor_parallel.py at 01b461a; --estimate.tp_inputs=linear)
each with sequence parallelism (norms SequenceParallel, inputs Shard(1), row-wise outputs Shard(1)) or without
(replicated inputs, row-wise outputs all-reduced), eager or under torch.compile; `-recompute` cases let the compiled
graph recompute everything it can (torch._functorch.config.activation_memory_budget = 0), as full AC does (this
torch refuses torch.compile over checkpoint_wrapper with DTensor inputs). A small block (dim 64, 4 heads, FFN 128)
runs three forward + backward passes on 2 gloo ranks; the third is recorded by torch.profiler and its c10d
collectives counted. Output: one line per case, all-gathers / reduce-scatters / all-reduces.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile

PLANS = ("module", "linear")
CASES = tuple(
    f"{plan}-{sp}-{mode}"
    for plan in PLANS
    for sp in ("sp", "nosp")
    for mode in ("eager", "compile", "compile-recompute")
    if not (sp == "nosp" and mode == "compile-recompute")
)
KINDS = {"all_gather": "all-gathers", "reduce_scatter": "reduce-scatters", "all_reduce": "all-reduces"}


def build_block(plan: str, sequence_parallel: bool, mesh):
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    class Attention(nn.Module):
        def __init__(self, d: int, heads: int):
            super().__init__()
            self.hd = d // heads
            self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
                nn.Linear(d, d, bias=False) for _ in range(4)
            )

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = (
                p(x).view(b, t, -1, self.hd).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj)
            )
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o_proj(o.transpose(1, 2).contiguous().view(b, t, -1))

    class MLP(nn.Module):
        def __init__(self, d: int, f: int):
            super().__init__()
            self.gate_proj, self.up_proj = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False)
            self.down_proj = nn.Linear(f, d, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class Block(nn.Module):
        def __init__(self, d: int = 64, heads: int = 4, f: int = 128):
            super().__init__()
            self.attention_norm, self.mlp_norm = nn.RMSNorm(d), nn.RMSNorm(d)
            self.attention, self.mlp = Attention(d, heads), MLP(d, f)

        def forward(self, x):
            h = x + self.attention(self.attention_norm(x))
            return h + self.mlp(self.mlp_norm(h))

    block = Block()
    stream = Shard(1) if sequence_parallel else Replicate()
    row = RowwiseParallel(output_layouts=stream, use_local_output=not sequence_parallel)
    colwise = ("attention.q_proj", "attention.k_proj", "attention.v_proj", "mlp.gate_proj", "mlp.up_proj")
    spec = {"attention.o_proj": row, "mlp.down_proj": row}
    if sequence_parallel:
        spec |= {"attention_norm": SequenceParallel(), "mlp_norm": SequenceParallel()}
    if plan == "linear":  # each column-wise linear takes the stream's layout itself
        spec |= {name: ColwiseParallel(input_layouts=stream) for name in colwise}
    else:  # one redistribute at each module's input, the linears take it replicated
        prepare = PrepareModuleInput(input_layouts=(stream,), desired_input_layouts=(Replicate(),))
        spec |= {"attention": prepare, "mlp": prepare, **{name: ColwiseParallel() for name in colwise}}
    parallelize_module(block, mesh, spec)
    return block


def count(case: str) -> dict[str, int]:
    """Collectives of one forward + backward of the block in `case` on this rank (run inside a 2-rank group)."""
    import torch
    from torch.distributed.tensor import DTensor, Shard

    plan, sp, mode = case.split("-", 2)
    mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    torch.manual_seed(0)
    block = build_block(plan, sp == "sp", mesh)
    import torch._functorch.config as functorch_config

    functorch_config.activation_memory_budget = 0.0 if mode == "compile-recompute" else 1.0
    run = torch.compile(block) if mode.startswith("compile") else block
    if sp == "sp":
        x = DTensor.from_local(torch.randn(2, 16 // mesh.size(), 64, requires_grad=True), mesh, [Shard(1)])
    else:
        x = torch.randn(2, 16, 64, requires_grad=True)
    counts: collections.Counter = collections.Counter()
    for i in range(3):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            y = run(x)
            (y.to_local() if isinstance(y, DTensor) else y).sum().backward()
        if i == 2:
            for e in prof.events():
                if e.name.startswith(("_c10d_functional::", "c10d_functional::")):
                    kind = next((k for k in KINDS if k in e.name), None)
                    counts[kind] += kind is not None
    torch._dynamo.reset()
    return {k: counts.get(k, 0) for k in KINDS}


def _worker(rank: int, cases: list[str], init: str, out: str) -> None:
    import json

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        res = {c: count(c) for c in cases}
    finally:
        dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(res, f)


def measure(cases: list[str]) -> dict[str, dict[str, int]]:
    """Each case's counts (rank 0's), from 2 gloo ranks: this script run twice with --worker."""
    import json
    import subprocess

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "counts.json")
        init = f"file://{os.path.join(d, 'rdzv')}"
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--worker", str(rank), init, out, ",".join(cases)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for rank in (0, 1)
        ]
        errs = [p.communicate()[1] for p in procs]
        if any(p.returncode for p in procs):
            raise RuntimeError(
                f"a rank failed: {next(e for p, e in zip(procs, errs) if p.returncode)[-2000:]}"
            )
        with open(out) as f:
            return json.load(f)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    p.add_argument("--worker", nargs=4, metavar=("RANK", "INIT", "OUT", "CASES"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        rank, init, out, cases = a.worker
        _worker(int(rank), cases.split(","), init, out)
        return 0
    cases = [c for c in a.cases.split(",") if c]
    bad = [c for c in cases if c not in CASES]
    if bad or not cases:
        print(f"error: --cases {','.join(bad) or 'empty'}: valid: {', '.join(CASES)}", file=sys.stderr)
        return 2
    res = measure(cases)
    print(f"{'case':<28} " + " ".join(f"{v:>15}" for v in KINDS.values()))
    for c in cases:
        print(f"{c:<28} " + " ".join(f"{res[c][k]:>15}" for k in KINDS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
