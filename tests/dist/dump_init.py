"""Build the debug model in the layout given on the command line, initialize it, save the FULL weights (rank 0).

    torchrun --nproc_per_node 2 tests/dist/dump_init.py OUT.pt [--section.key=value ...]

Also writes OUT.pt.json: how `parallelize` wrapped the model (its FSDP units, the dtype of parameters and of a
forward's logits).
"""

import json
import sys

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from torchtitan.config import parse_args
from torchtitan.models import get_model_class, model_args_from_config
from torchtitan.parallel import ParallelDims, fill_shard, init_distributed, parallelize


def main():
    out, argv = sys.argv[1], sys.argv[2:]
    cfg = parse_args(argv)
    device = torch.device("cpu")
    rank, world = init_distributed(device, 60)
    dims = ParallelDims.from_config(cfg.parallelism, world)
    dims.build_mesh("cpu")
    with torch.device("meta"):
        model = get_model_class(cfg.model.name)(model_args_from_config(cfg.model, cfg.training.seq_len))
    model = parallelize(model, dims, cfg)
    model.to_empty(device=device)
    model.init_weights(cfg.training.seed, fill=fill_shard)
    full = {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone() for k, v in model.state_dict().items()}
    units = [name for name, m in model.named_modules() if isinstance(m, FSDPModule)]
    logits = model(torch.zeros(1, 8, dtype=torch.long))
    logits = logits.full_tensor() if isinstance(logits, DTensor) else logits
    structure = {
        "fsdp_units": units,
        "param_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
        "logits_dtype": str(logits.dtype),
    }
    if rank == 0:
        torch.save(full, out)
        with open(f"{out}.json", "w") as f:
            json.dump(structure, f)
    torch.distributed.barrier()  # leave together: gloo aborts a peer whose pairs close mid-teardown
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
