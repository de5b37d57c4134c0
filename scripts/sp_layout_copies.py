"""Count the layout copies torch.compile keeps around sequence-parallel collectives (docs/estimate.md, "Rates").

Sequence parallelism shards the residual stream [batch, seq, dim] on dim 1; NCCL/gloo gather and scatter on dim 0.
This compiles a tiny sequence-parallel block (RMSNorm -> colwise w1 -> ReLU -> rowwise w2 -> residual; the same
SequenceParallel / ColwiseParallel / RowwiseParallel styles as the trainer's TP plan) on 2 CPU processes, runs one
forward + backward, and reports, per Inductor graph, the all-gathers and reduce-scatters and the `cat` copy
kernels Inductor generated next to them, for local batch 1 and 2.

    OMP_NUM_THREADS=1 python -m torch.distributed.run --nproc_per_node=2 scripts/sp_layout_copies.py
"""

from __future__ import annotations

import re

import torch
import torch.distributed as dist
from torch import nn
from torch._inductor.utils import run_and_get_code
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)


class Block(nn.Module):
    def __init__(self, dim: int = 64, hidden: int = 128):
        super().__init__()
        self.norm = nn.RMSNorm(dim)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w2(torch.relu(self.w1(self.norm(x))))


def count(batch: int, mesh) -> list[dict[str, int]]:
    torch._dynamo.reset()
    block = Block()
    plan = {"norm": SequenceParallel(), "w1": ColwiseParallel(input_layouts=Shard(1)),
            "w2": RowwiseParallel(output_layouts=Shard(1))}  # fmt: skip
    parallelize_module(block, mesh, plan)
    x = torch.randn(batch, 16 // mesh.size(), 64, requires_grad=True)
    compiled = torch.compile(block)

    def step() -> None:
        compiled(x).sum().backward()

    _, codes = run_and_get_code(step)
    out = []
    for code in codes:
        calls = [line.strip() for line in code.split("\n") if not re.search(r"async_compile|^\s*#", line)]
        out.append({
            "all_gathers": sum("all_gather_into_tensor.default(" in c for c in calls),
            "reduce_scatters": sum("reduce_scatter_tensor.default(" in c for c in calls),
            "cat_copy_kernels": sum(bool(re.match(r"cpp_fused\w*cat\w*\(", c)) for c in calls),
        })  # fmt: skip
    return out


def main() -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    for batch in (1, 2):
        graphs = count(batch, mesh)
        if dist.get_rank() == 0:
            for name, g in zip(("forward", "backward"), graphs):
                print(f"local batch {batch}, {name}: {g}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
