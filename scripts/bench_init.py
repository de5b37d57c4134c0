"""Time the layout-independent weight init of a flavor: per rank, elements computed and elements/s.

    python scripts/bench_init.py --flavor 1B --vocab_size 2048                     # one process
    torchrun --nproc_per_node 2 scripts/bench_init.py --flavor 1B --vocab_size 2048  # FSDP 2: each rank its half
    python scripts/bench_init.py --flavor 1B --reference                          # + torch's normal_ and
                                                                                   #   trunc_normal_ on as many
Any further --section.key=value arguments are config overrides (e.g. --parallelism.tensor_parallel_degree=2).
The first timed pass also pays the page faults of freshly allocated parameters, as a real run does.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

from torchtitan.config import parse_args  # noqa: E402
from torchtitan.models import get_model_class, model_args_from_config  # noqa: E402
from torchtitan.parallel import (  # noqa: E402
    ParallelDims,
    init_distributed,
    local_coords,
    materialize,
    parallelize,
    pick_device,
)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--flavor", default="1B")
    p.add_argument("--vocab_size", type=int, default=None)
    p.add_argument("--reference", action="store_true", help="also time normal_ and trunc_normal_ on CPU")
    a, overrides = p.parse_known_args()
    device = pick_device()
    rank, world = init_distributed(device, 300)
    cfg = parse_args([f"--model.flavor={a.flavor}", "--training.seq_len=64", *overrides])
    if a.vocab_size:
        cfg.model.vocab_size = a.vocab_size
    dims = ParallelDims.from_config(cfg.parallelism, world)
    dims.build_mesh(device.type)
    with torch.device("meta"):
        model = get_model_class(cfg.model.name)(model_args_from_config(cfg.model, 64))
    parallelize(model, dims, cfg)
    materialize(model, device)
    local = sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in model.parameters())
    total = sum(p.numel() for p in model.parameters())
    t0 = time.perf_counter()
    model.init_weights(0, local_coords=local_coords)
    if device.type == "cuda":
        torch.cuda.synchronize()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    model.init_weights(0, local_coords=local_coords)
    if device.type == "cuda":
        torch.cuda.synchronize()
    again = time.perf_counter() - t0
    print(
        f"rank {rank}/{world} {a.flavor}: {local:,} of {total:,} elements on this rank; init {first:.2f} s"
        f" (first, with page faults; {local / first / 1e6:.0f} M/s), {again:.2f} s again"
        f" ({local / again / 1e6:.0f} M/s) on {device.type}",
        flush=True,
    )
    if a.reference and rank == 0:
        n = min(local, 1 << 28)
        x = torch.empty(n)
        x.fill_(0)
        for name, fn in [
            ("normal_", lambda: x.normal_()),
            ("nn.init.trunc_normal_", lambda: torch.nn.init.trunc_normal_(x, 0, 0.02, -0.04, 0.04)),
        ]:
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            print(f"reference {name} on {n:,} elements: {dt:.2f} s ({n / dt / 1e6:.0f} M/s)", flush=True)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
