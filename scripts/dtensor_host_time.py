#!/usr/bin/env python
"""Host (CPU) time of the step-boundary work an FSDP rank does on its parameters: AdamW's step (foreach and fused)
and clip_grad_norm_ (foreach), over plain tensors and over DTensors sharded 8 ways, for the Llama 3 8B's parameter
list (291 tensors: 32 blocks x 9, the embedding, the final norm, the output layer).

    python scripts/dtensor_host_time.py            # elements per local shard: 64 (dispatch cost, not bandwidth)
    python scripts/dtensor_host_time.py --numel 4096

One process over torch's fake process group (torch.testing._internal.distributed.fake_pg: nothing is sent), on
this machine's CPU. The tensors are tiny on purpose: what is timed is what the host pays per step to issue the
work (dispatch, DTensor's sharding propagation, the optimizer's Python), the part that would stay the same on a
GPU host whose kernels run elsewhere; on a CPU the foreach ops also loop per tensor, so the plain-tensor figures
are an upper bound for a GPU's fused multi-tensor launches, and the DTensor minus plain difference is DTensor's own
cost. docs/estimate_log.md, "The per-step gap of 8-GPU FSDP runs", uses it.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.testing._internal.distributed.fake_pg import FakeStore

N_PARAMS = 32 * 9 + 3  # the 8B's parameters: 32 blocks x (7 linears + 2 norms), embedding, norm, output
WORLD = 8


def params(mesh, numel: int, sharded: bool) -> list[torch.nn.Parameter]:
    out = []
    for _ in range(N_PARAMS):
        t = torch.randn(WORLD * numel)
        p = torch.nn.Parameter(distribute_tensor(t, mesh, [Shard(0)]) if sharded else t)
        p.grad = torch.randn_like(p)
        out.append(p)
    return out


def median_s(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--numel", type=int, default=64, help="elements of each local shard")
    ap.add_argument("--repeats", type=int, default=15)
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
    mesh = init_device_mesh("cpu", (WORLD,))
    print(f"{N_PARAMS} parameters, {a.numel} elements per local shard, median of {a.repeats}, ms on this CPU")
    print("| work | plain tensors | DTensor (Shard(0) over 8) |")
    print("| --- | ---: | ---: |")
    for impl in ("foreach", "fused"):
        row = []
        for sharded in (False, True):
            ps = params(mesh, a.numel, sharded)
            opt = torch.optim.AdamW(ps, lr=1e-4, foreach=impl == "foreach", fused=impl == "fused")
            row.append(median_s(opt.step, a.repeats))
        print(f"| AdamW step ({impl}) | {row[0] * 1e3:.2f} | {row[1] * 1e3:.2f} |")
    row = []
    for sharded in (False, True):
        ps = params(mesh, a.numel, sharded)
        row.append(median_s(lambda ps=ps: torch.nn.utils.clip_grad_norm_(ps, 1.0, foreach=True), a.repeats))
    print(f"| clip_grad_norm_ (foreach) | {row[0] * 1e3:.2f} | {row[1] * 1e3:.2f} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
