"""2 ranks: clip_grad_norm_ over gradients on different meshes/placements, and summed over a pipeline mesh.

    torchrun --nproc_per_node 2 tests/dist/clip_norm.py
Prints "ok" on rank 0 when every check holds (asserts otherwise).
"""

import math

import torch
import torch.distributed as dist
from teardown import leave  # tests/dist/teardown.py, beside this script
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from torchtitan.optim import clip_grad_norm_


def param_with_grad(full_grad, mesh=None, placements=None):
    if mesh is None:
        p = torch.nn.Parameter(torch.zeros_like(full_grad))
        p.grad = full_grad.clone()
        return p
    p = torch.nn.Parameter(distribute_tensor(torch.zeros_like(full_grad), mesh, placements))
    p.grad = distribute_tensor(full_grad.clone(), mesh, placements)
    return p


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same full gradients on both ranks
    a, b, c = torch.randn(6, 4), torch.randn(4, 6), torch.randn(5)
    mesh_2d = init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "tp"))
    mesh_1d = init_device_mesh("cpu", (2,), mesh_dim_names=("x",))
    expected = math.sqrt(sum(t.double().square().sum().item() for t in (a, b, c)))

    # three groups: 2-D sharded on the second dim, 1-D sharded, 1-D replicated
    params = [
        param_with_grad(a, mesh_2d, [Replicate(), Shard(0)]),
        param_with_grad(b, mesh_1d, [Shard(1)]),
        param_with_grad(c, mesh_1d, [Replicate()]),
    ]
    norm = clip_grad_norm_(params, max_norm=1.0)
    assert abs(norm.item() - expected) < 1e-5 * expected, (norm.item(), expected)
    clipped = math.sqrt(sum(p.grad.full_tensor().double().square().sum().item() for p in params))
    assert abs(clipped - 1.0) < 1e-5, clipped  # every group was scaled by the same coefficient

    # pipeline stages hold disjoint parameters: rank r's stage has plain gradient (r + 1) * a
    pp_mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("pp",))
    stage = [param_with_grad((rank + 1) * a)]
    norm = clip_grad_norm_(stage, max_norm=0, pp_mesh=pp_mesh)
    expected = math.sqrt(5) * a.double().norm().item()  # sqrt(1^2 + 2^2) * |a|
    assert abs(norm.item() - expected) < 1e-5 * expected, (norm.item(), expected)
    assert torch.equal(stage[0].grad, (rank + 1) * a)  # max_norm <= 0: not clipped
    if rank == 0:
        print("ok")
    leave()  # together, skipping the interpreter's teardown (tests/dist/teardown.py)


if __name__ == "__main__":
    main()
