"""Build the debug model in the layout given on the command line, initialize it, save the FULL weights.

    torchrun --nproc_per_node 2 tests/dist/dump_init.py OUT.pt [--section.key=value ...]
    torchrun --nproc_per_node 2 tests/dist/dump_init.py --many SPEC.json    # [[OUT.pt, arg, ...], ...]

With --many, one layout after the other in the same processes (each on its own process group), which saves the
start-up of a torchrun per layout.

Every rank writes the full (gathered over FSDP/TP) values of the parameters it holds to OUT.pt.<rank>; the test
merges them by name, so pipeline stages on different ranks together give the whole model. Without pipeline
parallelism rank 0 also writes OUT.pt.json: how `parallelize` wrapped the model (its FSDP units, the dtype of
parameters and of a forward's logits).
"""

import functools
import json
import sys

import torch
import torch.distributed as dist
from teardown import leave  # tests/dist/teardown.py, beside this script
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from torchtitan.config import parse_args
from torchtitan.loss import cross_entropy_loss
from torchtitan.models import get_model_class, model_args_from_config
from torchtitan.parallel import (
    ParallelDims,
    init_distributed,
    local_coords,
    materialize,
    parallelize,
    pipeline_parallelize,
    plan_pipeline,
)


def structure(model: torch.nn.Module) -> dict:
    units = [name for name, m in model.named_modules() if isinstance(m, FSDPModule)]
    logits = model(torch.zeros(1, 8, dtype=torch.long))
    logits = logits.full_tensor() if isinstance(logits, DTensor) else logits
    return {
        "fsdp_units": units,
        "param_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
        "logits_dtype": str(logits.dtype),
    }


def dump(out: str, argv: list[str]) -> None:
    cfg = parse_args(argv)
    device = torch.device("cpu")
    rank, world = init_distributed(device, 60)
    dims = ParallelDims.from_config(cfg.parallelism, world)
    dims.build_mesh("cpu")
    args = model_args_from_config(cfg.model, cfg.training.seq_len)
    with torch.device("meta"):
        model = get_model_class(cfg.model.name)(args)
    if dims.pp_enabled:
        plan = plan_pipeline(cfg.parallelism, args.n_layers, cfg.training.local_batch_size)
        loss_fn = functools.partial(cross_entropy_loss, global_tokens=1)
        _, parts, _, _ = pipeline_parallelize(model, plan, dims, cfg, device, loss_fn)
    else:
        parts = [parallelize(model, dims, cfg)]
    full = {}
    for part in parts:
        materialize(part, device)
        part.init_weights(cfg.training.seed, local_coords=local_coords)
        for k, v in part.state_dict().items():
            full[k] = (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
    torch.save(full, f"{out}.{rank}")
    if not dims.pp_enabled:
        wrapped = structure(parts[0])  # a forward: collective under FSDP/TP, so every rank runs it
        if rank == 0:
            with open(f"{out}.json", "w") as f:
                json.dump(wrapped, f)


if __name__ == "__main__":
    if sys.argv[1] == "--many":
        with open(sys.argv[2]) as f:
            jobs = json.load(f)
    else:
        jobs = [sys.argv[1:]]
    for i, (out, *argv) in enumerate(jobs):
        if i:  # the next layout builds its own default group
            dist.barrier()
            dist.destroy_process_group()
        dump(out, argv)
    leave()  # together, skipping the interpreter's teardown (tests/dist/teardown.py)
