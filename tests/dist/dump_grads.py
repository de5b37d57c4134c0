"""One forward+backward of the debug model in the layout given on the command line; save the FULL gradients.

    torchrun --nproc_per_node 2 tests/dist/dump_grads.py OUT.pt [--section.key=value ...]

Every rank writes the gradients of the parameters it holds (gathered over FSDP) to OUT.pt.<rank>; the test
merges them by name, so pipeline stages on different ranks together give the whole model's gradients.
"""

import functools
import sys

import torch
from teardown import leave  # tests/dist/teardown.py, beside this script
from torch.distributed.tensor import DTensor

from torchtitan.config import parse_args
from torchtitan.data import build_dataloader, build_tokenizer
from torchtitan.loss import cross_entropy_loss, forward_backward
from torchtitan.models import get_model_class, model_args_from_config
from torchtitan.optim import clip_grad_norm_
from torchtitan.parallel import (
    ParallelDims,
    init_distributed,
    local_coords,
    materialize,
    parallelize,
    pipeline_parallelize,
    plan_pipeline,
)


def main():
    out, argv = sys.argv[1], sys.argv[2:]
    cfg = parse_args(argv)
    device = torch.device("cpu")
    rank, world = init_distributed(device, 60)
    dims = ParallelDims.from_config(cfg.parallelism, world)
    dims.build_mesh("cpu")
    args = model_args_from_config(cfg.model, cfg.training.seq_len)
    with torch.device("meta"):
        model = get_model_class(cfg.model.name)(args)
    t = cfg.training
    global_tokens = t.local_batch_size * t.seq_len * dims.dp  # one micro-step: no gradient accumulation
    pp = None
    if dims.pp_enabled:
        plan = plan_pipeline(cfg.parallelism, args.n_layers, cfg.training.local_batch_size)
        loss_fn = functools.partial(cross_entropy_loss, global_tokens=global_tokens)
        schedule, parts, first, last = pipeline_parallelize(model, plan, dims, cfg, device, loss_fn)
        pp = (schedule, first, last)
    else:
        parts = [parallelize(model, dims, cfg)]
    for part in parts:
        materialize(part, device)
        part.init_weights(cfg.training.seed, local_coords=local_coords)
    loader = build_dataloader(
        dataset=cfg.data.dataset,
        dataset_path=None,
        text_field="text",
        tokenizer=build_tokenizer(cfg.model.tokenizer_path),
        dp_rank=dims.mesh("dp").get_local_rank(),
        dp_world_size=dims.dp,
        batch_size=t.local_batch_size,
        seq_len=t.seq_len,
        num_shards=cfg.data.num_shards,
    )
    inputs, labels = next(iter(loader))
    loss = forward_backward(parts, inputs, labels, global_tokens, pp=pp)
    params = [p for part in parts for p in part.parameters()]
    norm = clip_grad_norm_(params, 0.0, pp_mesh=dims.mesh("pp") if dims.pp_enabled else None)
    grads = {"loss": loss, "grad_norm": norm}
    for part in parts:
        for name, p in part.named_parameters():
            g = p.grad
            if g is None:
                print(f"rank {rank}: no grad for {name}", flush=True)
                continue
            grads[name] = (g.full_tensor() if isinstance(g, DTensor) else g).clone()
    torch.save(grads, f"{out}.{rank}")
    leave()  # together, skipping the interpreter's teardown (tests/dist/teardown.py)


if __name__ == "__main__":
    main()
