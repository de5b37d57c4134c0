"""Simulated ranks against the estimator: the rows of docs/estimate.md, "Simulated ranks".

    python scripts/simulate_check.py                       # every row, full depth, seq 64, 2 steps
    python scripts/simulate_check.py --rows 70b_fsdp32_tp8 --seq 64
    python scripts/simulate_check.py --n_layers 4 --seq 16  # the cut-depth variant tests/test_simulate.py runs

Each row runs `python train.py ... --comm.mode=fake_backend` in its own process (so its peak resident set is its
own) and prints one markdown line: this rank's parameter, gradient and optimizer-state bytes counted from its
tensors against the estimator's (torchtitan.estimate.memory.state_bytes), the estimator's peak, the measured peak of
the tensors alive at once (the first step, counted by torch's MemTracker) and of the process's resident set, the
step time and the estimator's compute time. The context-parallel row runs through tests/dist/train_cp_cpu.py, which
gives torch's ring attention the CPU kernel (context parallel is CUDA-only as shipped).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30

# id -> (world size, simulated rank, layout and model arguments). Ranks are picked off rank 0 where it matters:
# mesh order is pp x dp_replicate x dp_shard x cp x tp, so rank // (world / pp) is the pipeline rank.
ROWS = {
    "8b_fsdp64": (64, 37, ["--model.flavor=8B", "--activation_checkpoint.mode=selective"]),
    "70b_fsdp32_tp8": (
        256,
        200,
        ["--model.flavor=70B", "--parallelism.tensor_parallel_degree=8", "--activation_checkpoint.mode=full"],
    ),
    "405b_fsdp8_tp8_pp8_1f1b": (
        512,
        5,  # pipeline rank 0: the embedding and the first stage's blocks
        [
            "--model.flavor=405B",
            "--parallelism.tensor_parallel_degree=8",
            "--parallelism.pipeline_parallel_degree=8",
            "--parallelism.pipeline_parallel_schedule=1F1B",
            "--training.local_batch_size=8",
            "--parallelism.pipeline_parallel_microbatch_size=1",
            "--activation_checkpoint.mode=full",
        ],
    ),
    "405b_fsdp8_tp8_pp8_interleaved": (
        512,
        511,  # pipeline rank 7: stages 7 and 15, the last one with the output head
        [
            "--model.flavor=405B",
            "--parallelism.tensor_parallel_degree=8",
            "--parallelism.pipeline_parallel_degree=8",
            "--parallelism.pipeline_parallel_schedule=Interleaved1F1B",
            "--parallelism.pipeline_parallel_stages_per_rank=2",
            "--training.local_batch_size=8",
            "--parallelism.pipeline_parallel_microbatch_size=1",
            "--activation_checkpoint.mode=full",
        ],
    ),
    "8b_hsdp8x8": (
        64,
        9,
        [
            "--model.flavor=8B",
            "--parallelism.data_parallel_replicate_degree=8",
            "--parallelism.data_parallel_shard_degree=8",
            "--activation_checkpoint.mode=selective",
        ],
    ),
    "8b_fsdp32_cp2": (
        64,
        3,
        ["--model.flavor=8B", "--parallelism.context_parallel_degree=2", "--activation_checkpoint.mode=full"],
    ),
}
# Full-depth 405B ranks do not fit this 24 GB machine (pipeline rank 0 holds 16 blocks: ~13.5 GB of fp32
# weights + AdamW, 12.8 GB of gathered bf16 blocks and 25.6 GB of unsharded fp32 gradients under PP): their
# "full" runs keep the full width and vocabulary with one block per stage (8 layers for 1F1B, 16 interleaved),
# which keeps every per-block ratio (a 1-block stage measured 11.9 GB resident at vocabulary 32,768; 4 blocks would
# not fit). At the full vocabulary the first stage (rank 5) also holds the TP-split embedding's whole-table
# gradients, an fp32 accumulator and a bf16 table (11.7 GiB), and does not fit 24 GB either: there, pass
# --vocab 65536 (docs/estimate.md, "Pipeline ranks' tensors").
FULL_LAYERS = {"405b_fsdp8_tp8_pp8_1f1b": 8, "405b_fsdp8_tp8_pp8_interleaved": 16}


def row_args(
    row: str, seq: int, steps: int, n_layers: int | None, dump: str, vocab: int | None = None
) -> list[str]:
    world, rank, layout = ROWS[row]
    args = [
        "--job.config_file=train_configs/debug_model.toml",  # tokenizer and data are not read in fake mode
        "--job.print_config=false",
        f"--job.dump_folder={dump}",
        "--metrics.enable_tensorboard=false",
        f"--training.seq_len={seq}",
        "--training.local_batch_size=1",
        f"--training.steps={steps}",
        "--comm.mode=fake_backend",
        f"--comm.fake_world_size={world}",
        f"--comm.fake_rank={rank}",
        *layout,
    ]
    if n_layers is not None:  # at least one block per pipeline stage
        stages = 8 * (2 if "Interleaved" in " ".join(layout) else 1) if world == 512 else 1
        args.append(f"--model.n_layers={max(n_layers, stages)}")
    if vocab is not None:
        args.append(f"--model.vocab_size={vocab}")
    return args


def estimator_states(args: list[str], world: int, rank: int) -> dict[str, float]:
    """The estimator's parameter / gradient / optimizer-state GiB for the rank's pipeline rank."""
    from torchtitan.config import parse_args
    from torchtitan.estimate.memory import state_bytes
    from torchtitan.estimate.plan import build_plan

    # the states do not depend on the hardware; a GPU entry lets a context-parallel layout plan on this CPU
    cfg = parse_args([*args, f"--estimate.num_devices={world}", "--estimate.hardware=h100-sxm"])
    plan = build_plan(cfg, require_rates=False)
    d = plan.dims
    pp_rank = rank // (world // d.pp)
    fsdp_index = (rank // d.tp) % (d.dp_shard * d.cp)  # mesh order pp, dp_replicate, dp_shard, cp, tp
    return {k: v / GIB for k, v in state_bytes(plan, pp_rank, fsdp_index).items()}


def run_row(
    row: str,
    seq: int = 64,
    steps: int = 2,
    n_layers: int | None = None,
    vocab: int | None = None,
    extra: list[str] = (),
    env=None,
) -> dict:
    """Simulate the row's rank in a fresh process; its simulation.json plus the estimator's states and the wall
    time of the whole process."""
    world, rank, _ = ROWS[row]
    with tempfile.TemporaryDirectory() as dump:
        args = [*row_args(row, seq, steps, n_layers, dump, vocab), *extra]
        cp = any(a.startswith("--parallelism.context_parallel_degree") for a in args)
        script = "tests/dist/train_cp_cpu.py" if cp else "train.py"
        started = time.perf_counter()
        r = subprocess.run(
            [sys.executable, script, *args],
            cwd=ROOT,
            env=env or {**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=1800,
        )
        wall = time.perf_counter() - started
        if r.returncode != 0:
            raise RuntimeError(f"{row}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        result = json.loads((Path(dump) / "simulation.json").read_text())
    result["estimated_states_gib"] = estimator_states(args, world, rank)
    result["wall_s"] = wall
    result["row"] = row
    return result


def states_error(result: dict) -> dict[str, float]:
    """Relative difference measured vs estimated, per state kind."""
    m, e = result["measured_gib"], result["estimated_states_gib"]
    return {k: m[k] / e[k] - 1 for k in ("parameters", "gradients", "optimizer_states")}


def markdown(result: dict, n_layers) -> str:
    m, est, e = result["measured_gib"], result["estimated_gib"], result["estimated_states_gib"]
    err = states_error(result)
    states = " / ".join(f"{m[k]:.3f} vs {e[k]:.3f} ({err[k]:+.2%})" for k in err)
    tensors = m.get("max_allocated")
    return (
        f"| {result['row']} | {result['world_size']} | {result['rank']} | {n_layers or 'all'} | {states} |"
        f" {est['activations']:.3f} | {est['peak']:.3f} | {'n/a' if tensors is None else f'{tensors:.3f}'} |"
        f" {m['peak']:.3f} | {result['step_time_s']:.2f} |"
        f" {result['estimated_compute_s']:.2f} | {result['wall_s']:.0f} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", nargs="*", default=list(ROWS))
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument(
        "--n_layers", type=int, default=None, help="cut every model to this depth (default: full)"
    )
    ap.add_argument(
        "--vocab", type=int, default=None, help="model.vocab_size override (default: the flavor's)"
    )
    a = ap.parse_args()
    print(
        "| row | world | rank | layers | params / grads / AdamW GiB: simulated vs estimated |"
        " est. activations GiB | est. peak GiB | measured tensor peak GiB | measured peak RSS GiB | step s |"
        " est. compute s | wall s |"
    )
    print("| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in a.rows:
        n_layers = a.n_layers if a.n_layers is not None else FULL_LAYERS.get(row)
        print(markdown(run_row(row, a.seq, a.steps, n_layers, a.vocab), n_layers), flush=True)


if __name__ == "__main__":
    main()
