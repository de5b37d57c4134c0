"""This rank's local parameter shapes after the trainer's own build path, in a real or a fake process group.

    torchrun --nproc_per_node 4 tests/dist/shard_shapes.py OUT_DIR            # real gloo ranks
    python tests/dist/shard_shapes.py OUT_DIR --fake 4                        # ranks 0..3 of 4, fake backend

For each layout below: ParallelDims -> mesh -> parallelize (or the pipeline split) -> materialize, exactly as
torchtitan/train.py builds a model, then {parameter name: local shape} per rank into OUT_DIR/<layout>_<rank>.json.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from teardown import leave  # tests/dist/teardown.py, beside this script
from torch.distributed.tensor import DTensor

from torchtitan.config import parse_args
from torchtitan.models import get_model_class, model_args_from_config
from torchtitan.parallel import (
    ParallelDims,
    init_distributed,
    materialize,
    parallelize,
    pipeline_parallelize,
    plan_pipeline,
)
from torchtitan.simulate import Simulation

BASE = [
    "--job.config_file=train_configs/debug_model.toml",
    "--training.seq_len=32",
    "--training.local_batch_size=2",
]
LAYOUTS = {
    "fsdp2_tp2": ["--parallelism.data_parallel_shard_degree=2", "--parallelism.tensor_parallel_degree=2"],
    "pp2_fsdp2": [
        "--parallelism.data_parallel_shard_degree=2",
        "--parallelism.pipeline_parallel_degree=2",
        "--parallelism.pipeline_parallel_schedule=1F1B",
        "--parallelism.pipeline_parallel_microbatch_size=1",
    ],
    "hsdp2x2": [
        "--parallelism.data_parallel_replicate_degree=2",
        "--parallelism.data_parallel_shard_degree=2",
    ],
}


def shapes(cfg, world: int, device) -> dict[str, list[int]]:
    dims = ParallelDims.from_config(cfg.parallelism, world)
    args = model_args_from_config(cfg.model, cfg.training.seq_len)
    dims.build_mesh(device.type)
    with torch.device("meta"):
        model = get_model_class(cfg.model.name)(args)
    if dims.pp_enabled:
        plan = plan_pipeline(cfg.parallelism, args.n_layers, cfg.training.local_batch_size)
        _, parts, _, _ = pipeline_parallelize(model, plan, dims, cfg, device, lambda *a: None)
    else:
        parts = [parallelize(model, dims, cfg)]
    out = {}
    for part in parts:
        materialize(part, device)
        for name, p in part.named_parameters():
            local = p.to_local() if isinstance(p, DTensor) else p
            out[name] = list(local.shape)
    return out


def main() -> None:
    out_dir = Path(sys.argv[1])
    device = torch.device("cpu")
    if "--fake" in sys.argv:
        world = int(sys.argv[sys.argv.index("--fake") + 1])
        for rank in range(world):
            for name, layout in LAYOUTS.items():
                fake = [*BASE, *layout, "--comm.mode=fake_backend", f"--comm.fake_world_size={world}"]
                cfg = parse_args([*fake, f"--comm.fake_rank={rank}"])
                Simulation(cfg).init_process_group()
                (out_dir / f"{name}_{rank}.json").write_text(json.dumps(shapes(cfg, world, device)))
                dist.destroy_process_group()
        return
    rank, world = init_distributed(device, 300)
    for name, layout in LAYOUTS.items():
        cfg = parse_args([*BASE, *layout])
        (out_dir / f"{name}_{rank}.json").write_text(json.dumps(shapes(cfg, world, device)))
    leave()  # together, skipping the interpreter's teardown (tests/dist/teardown.py)


if __name__ == "__main__":
    main()
