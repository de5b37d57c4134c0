"""Save/load time of a model + AdamW checkpoint, sync vs async, and how long an async save blocks the caller.

    python scripts/bench_checkpoint.py --flavor debugmodel
    python scripts/bench_checkpoint.py --flavor 1B --n_layers 2      # what fits a small CPU machine
One process (FSDP2 on a 1-rank mesh, as the trainer runs it); writes under --folder, deleted at the end.
"""

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from torchtitan.checkpoint import CheckpointManager  # noqa: E402
from torchtitan.config import parse_args  # noqa: E402
from torchtitan.models import get_model_class, model_args_from_config  # noqa: E402
from torchtitan.optim import build_lr_scheduler, build_optimizer  # noqa: E402
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
    p.add_argument("--flavor", default="debugmodel")
    p.add_argument("--n_layers", type=int, default=None, help="override the flavor's depth (to fit memory)")
    p.add_argument("--folder", default=None)
    a = p.parse_args()
    folder = a.folder or tempfile.mkdtemp(prefix="bench_ckpt_")
    device = pick_device()
    init_distributed(device, 300)
    cfg = parse_args(
        [f"--model.flavor={a.flavor}", f"--job.dump_folder={folder}", "--checkpoint.enable=true"]
    )
    dims = ParallelDims.from_config(cfg.parallelism, 1)
    dims.build_mesh(device.type)
    args = model_args_from_config(cfg.model, 2048)
    if a.n_layers:
        args.n_layers = a.n_layers
    with torch.device("meta"):
        model = get_model_class("llama3")(args)
    parallelize(model, dims, cfg)
    materialize(model, device)
    model.init_weights(0, local_coords=local_coords)
    opt = build_optimizer([model], cfg)
    for p_ in model.parameters():  # one step with zero grads creates the AdamW moments
        p_.grad = torch.zeros_like(p_)
    opt.step()
    sched = build_lr_scheduler(opt, cfg)
    n = sum(p_.numel() for p_ in model.parameters())
    print(
        f"{a.flavor} n_layers={args.n_layers}: {n / 1e6:.1f}M parameters, checkpoint ~{n * 12 / 2**30:.2f} GiB"
    )
    for mode in ("disabled", "async"):
        cfg.checkpoint.async_mode = mode
        m = CheckpointManager(cfg, [model], opt, sched, None, rank=0, dp_rank=0, dp=1)
        t0 = time.perf_counter()
        m.save(1, 0)
        blocked = time.perf_counter() - t0
        m.wait()
        total = time.perf_counter() - t0
        print(f"save {mode:8s}: caller blocked {blocked:7.3f} s, until committed {total:7.3f} s")
        t0 = time.perf_counter()
        m.load()
        print(f"load          : {time.perf_counter() - t0:7.3f} s")
        shutil.rmtree(Path(folder) / "checkpoint")
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
