"""The estimator counts FSDP's all-gathers as the trainer issues them: under pipeline parallelism with blocks
resharded after forward (`--parallelism.fsdp_reshard_after_forward=always`) every micro-batch's backward gathers
them again (steptime.fsdp_regathers), where the default keeps them gathered for the whole schedule step.

The trainer runs on 4 CPU ranks (PP 2 x FSDP 2, 1F1B, 4 micro-batches of one sequence) with torch.distributed's
all-gather counted per step (tests/dist/train_instrumented.py; from step 2 on: the first step also runs torch's
pipeline shape inference, a real forward and backward); the count each rank makes in a step is compared with
the estimator's: each of its units gathered once per round, the blocks and the embedding again `fsdp_regathers`
times, the head (final norm + output, kept gathered) not again.
"""

import pytest
from test_startup import instrumented

from conftest import FIXED_PEAK, TINY
from torchtitan.config import parse_args
from torchtitan.estimate.plan import build_plan
from torchtitan.estimate.steptime import fsdp_regathers

LAYOUT = [
    *TINY,
    FIXED_PEAK,
    "--training.steps=3",
    "--training.local_batch_size=4",
    "--parallelism.pipeline_parallel_degree=2",
    "--parallelism.pipeline_parallel_schedule=1F1B",
    "--parallelism.pipeline_parallel_microbatch_size=1",
    "--parallelism.data_parallel_shard_degree=2",
]


def plan_of(args: list[str]):
    return build_plan(parse_args([*args, "--estimate.num_devices=4", "--estimate.hardware=h100-sxm"]))


def estimated_gathers(args: list[str]) -> list[int]:
    """All-gather calls per optimizer step of each rank's FSDP units, by the estimator's plan (rank order: the
    pipeline stage outermost, as ParallelDims lays it out); the part named only completes the plan."""
    plan = plan_of(args)
    again = fsdp_regathers(plan)
    per_stage = [
        plan.accum * ((n_blocks + has_emb) * (1 + again) + has_head)
        for n_blocks, has_emb, has_head in plan.rank_layers()
    ]
    return [per_stage[rank // plan.dims.dp_shard] for rank in range(4)]


@pytest.mark.parametrize("reshard, again", [("default", 0), ("always", 4)])
def test_pipeline_fsdp_gathers_per_step_are_the_trainers(tmp_path, reshard, again):
    args = [*LAYOUT, f"--parallelism.fsdp_reshard_after_forward={reshard}"]
    assert fsdp_regathers(plan_of(args)) == again  # "always": each of the 4 micro-batches' backwards
    _, reports = instrumented(tmp_path, 4, args)
    measured = [[rep["gathers_per_step"][str(step)] for step in (2, 3)] for rep in reports]
    expected = estimated_gathers(args)
    assert measured == [[n, n] for n in expected], (measured, expected)


def test_the_regathers_are_priced():
    """Under PP, "always" costs its m extra gathers of every block: exposed FSDP time (each beside a micro-batch's
    backward) and FSDP2's copy-out of each gather (in the compute); without PP, "always" and "default" both gather
    once more for backward and cost the same."""
    from torchtitan.estimate.training import estimate_plan

    def step(*extra):
        args = ["--model.flavor=8B", "--training.seq_len=8192", "--estimate.hardware=h100-sxm", *extra]
        return estimate_plan(build_plan(parse_args(args)))["step_time_breakdown_s"]

    pp = ["--estimate.num_devices=16", "--parallelism.pipeline_parallel_degree=2",
          "--parallelism.data_parallel_shard_degree=8", "--training.local_batch_size=8"]  # fmt: skip
    kept, again = step(*pp), step(*pp, "--parallelism.fsdp_reshard_after_forward=always")
    assert again["fsdp_comm_exposed"] > kept["fsdp_comm_exposed"] and again["compute"] > kept["compute"]
    assert again["pipeline_bubble"] >= kept["pipeline_bubble"]
    flat = ["--estimate.num_devices=8", "--training.local_batch_size=1"]
    assert step(*flat) == step(*flat, "--parallelism.fsdp_reshard_after_forward=always")
