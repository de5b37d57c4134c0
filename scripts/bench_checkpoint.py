"""Save/load time of a model + AdamW checkpoint, sync vs async, how long an async save blocks the caller, and
what the content checksums cost (docs/performance.md).

    python scripts/bench_checkpoint.py --flavor debugmodel
    python scripts/bench_checkpoint.py --flavor 1B --n_layers 2      # what fits a small CPU machine
    python scripts/bench_checkpoint.py --flavor debugmodel --checksums --repeat 5
One process (FSDP2 on a 1-rank mesh, as the trainer runs it); writes under --folder, deleted at the end.
--checksums alternates, --repeat times: DCP's FileSystemWriter vs our ChecksumWriter (same state, sync save),
and a load with checkpoint.verify_on_load off vs on; it prints each pair and the medians.
"""

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

from torchtitan.checkpoint import CheckpointManager, ChecksumWriter  # noqa: E402
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


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def checksum_overhead(m: CheckpointManager, folder: Path, repeat: int) -> None:
    """Alternating pairs: plain DCP writer vs ChecksumWriter; load without vs with verification."""
    state = m._dcp_state(model_only=False)
    saves, loads = {"plain": [], "checksums": []}, {"no verify": [], "verify": []}
    for i in range(repeat):
        order = ["plain", "checksums"] if i % 2 == 0 else ["checksums", "plain"]
        for kind in order:
            path = folder / f"bench-{kind}"
            writer = ChecksumWriter(path) if kind == "checksums" else dcp.FileSystemWriter(path)
            saves[kind].append(_timed(lambda w=writer: dcp.save(state, storage_writer=w)))
            shutil.rmtree(path)
        m.save(1, 0)
        for verify in [False, True] if i % 2 == 0 else [True, False]:
            m.c.verify_on_load = verify
            loads["verify" if verify else "no verify"].append(_timed(m.load))
        shutil.rmtree(folder / "checkpoint")
        print(
            f"pair {i}: save plain {saves['plain'][-1]:.3f} s, with checksums {saves['checksums'][-1]:.3f} s;"
            f" load {loads['no verify'][-1]:.3f} s, verified {loads['verify'][-1]:.3f} s"
        )
    for name, d in (("save", saves), ("load", loads)):
        (a, xa), (b, xb) = d.items()
        ratios = [y / x for x, y in zip(xa, xb)]
        print(
            f"{name}: median {a} {statistics.median(xa):.3f} s, {b} {statistics.median(xb):.3f} s,"
            f" median ratio {statistics.median(ratios):.3f} ({', '.join(f'{r:.3f}' for r in ratios)})"
        )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--flavor", default="debugmodel")
    p.add_argument("--n_layers", type=int, default=None, help="override the flavor's depth (to fit memory)")
    p.add_argument("--folder", default=None)
    p.add_argument("--checksums", action="store_true", help="measure the checksums' cost (see the docstring)")
    p.add_argument("--repeat", type=int, default=3, help="pairs for --checksums")
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
    if a.checksums:
        m = CheckpointManager(cfg, [model], opt, sched, None, rank=0, dp_rank=0, dp=1)
        m._check_identity = lambda *args, **kw: None  # n_layers was cut below the flavor's: no model check
        checksum_overhead(m, Path(folder), a.repeat)
        shutil.rmtree(folder, ignore_errors=True)
        return
    for mode in ("disabled", "async"):
        cfg.checkpoint.async_mode = mode
        m = CheckpointManager(cfg, [model], opt, sched, None, rank=0, dp_rank=0, dp=1)
        m._check_identity = lambda *args, **kw: None
        for step in (1, 2):  # the second async save reuses the first one's staging buffers
            t0 = time.perf_counter()
            m.save(step, 0)
            blocked = time.perf_counter() - t0
            m.wait()
            total = time.perf_counter() - t0
            print(f"save {mode:8s} #{step}: caller blocked {blocked:7.3f} s, until committed {total:7.3f} s")
        t0 = time.perf_counter()
        m.load()
        print(f"load             : {time.perf_counter() - t0:7.3f} s (checksums verified)")
        m.close()
        shutil.rmtree(Path(folder) / "checkpoint")
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
