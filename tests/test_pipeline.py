"""Pipeline planning without processes: stage splits, placement, every constraint message, stage modules."""

import pytest
import torch

from torchtitan.config import parse_args
from torchtitan.errors import UserError
from torchtitan.models.llama3 import Transformer, get_model_args
from torchtitan.parallel.pipeline import even_split, plan_pipeline, split_at, stage_module


def plan(*overrides, n_layers=6, batch=4, tied=False):
    cfg = parse_args(["--parallelism.pipeline_parallel_degree=2", *overrides])
    return plan_pipeline(cfg.parallelism, n_layers, batch, tied, cfg.activation_checkpoint)


def sizes(ranges):
    return [len(r) for r in ranges]


def test_even_split_gives_extra_layers_to_middle_stages():
    assert sizes(even_split(6, 2)) == [3, 3]
    assert sizes(even_split(6, 4)) == [1, 2, 2, 1]
    assert sizes(even_split(7, 3)) == [2, 3, 2]
    assert sizes(even_split(5, 5)) == [1] * 5
    r = even_split(32, 6)
    assert r[0].start == 0 and r[-1].stop == 32 and all(a.stop == b.start for a, b in zip(r, r[1:]))


def test_split_points_make_stages():
    assert split_at(6, ["layers.2", "layers.4"]) == [range(0, 2), range(2, 4), range(4, 6)]
    p = plan("--parallelism.pipeline_parallel_split_points=layers.1")
    assert p.stage_layers == [range(0, 1), range(1, 6)] and p.n_microbatches == 4


@pytest.mark.parametrize(
    "points, message",
    [
        ("layer.2", "'layer.2' is not a layer name; use 'layers.K' with 1 <= K < 6"),
        ("layers.0", "'layers.0' is out of range; a split point must be layers.1 .. layers.5"),
        ("layers.6", "'layers.6' is out of range"),
        ("layers.4,layers.2", "strictly increasing, got 'layers.2' after 'layers.4'"),
        ("layers.2,layers.4", "has 2 points, giving 3 stages, but pipeline_parallel_degree 2 x"),
    ],
)
def test_bad_split_points(points, message):
    with pytest.raises(UserError, match="pipeline_parallel_split_points") as e:
        plan(f"--parallelism.pipeline_parallel_split_points={points}")
    assert message in str(e.value)


@pytest.mark.parametrize(
    "overrides, kwargs, message",
    [
        (
            ["--parallelism.pipeline_parallel_stages_per_rank=4"],
            {},
            "'1F1B' runs one stage per rank, but pipeline_parallel_stages_per_rank=4",
        ),
        (
            [
                "--parallelism.pipeline_parallel_schedule=Interleaved1F1B",
                "--parallelism.pipeline_parallel_stages_per_rank=4",
            ],
            {},
            "the model has 6 layers, fewer than pipeline_parallel_degree 2 x pipeline_parallel_stages_per_rank 4 = 8",
        ),
        (
            ["--parallelism.pipeline_parallel_microbatch_size=3"],
            {},
            "training.local_batch_size=4 is not divisible by parallelism.pipeline_parallel_microbatch_size=3",
        ),
        (
            ["--parallelism.pipeline_parallel_microbatch_size=4"],
            {},
            "1 micro-batches (training.local_batch_size=4 / parallelism.pipeline_parallel_microbatch_size=4)"
            " is fewer than the 2 pipeline stages",
        ),
        (
            ["--parallelism.pipeline_parallel_schedule=Interleaved1F1B"],
            {},
            "interleaves several stages per rank, but pipeline_parallel_stages_per_rank=1",
        ),
        (
            [
                "--parallelism.pipeline_parallel_schedule=ZBVZeroBubble",
                "--parallelism.pipeline_parallel_stages_per_rank=3",
            ],
            {},
            "'ZBVZeroBubble' needs exactly 2 stages per rank",
        ),
        (
            [
                "--parallelism.pipeline_parallel_schedule=ZBVZeroBubble",
                "--parallelism.pipeline_parallel_stages_per_rank=2",
            ],
            {"batch": 2},
            "cannot run 2 micro-batches",
        ),
        (
            [
                "--parallelism.pipeline_parallel_schedule=Interleaved1F1B",
                "--parallelism.pipeline_parallel_stages_per_rank=2",
            ],
            {"batch": 5},
            "Interleaved1F1B with pipeline_parallel_degree 2 cannot run 5 micro-batches",
        ),
        (
            [
                "--parallelism.pipeline_parallel_schedule=InterleavedZeroBubble",
                "--parallelism.pipeline_parallel_stages_per_rank=2",
                "--parallelism.fsdp_reshard_after_forward=always",
            ],
            {},
            "loses the weight gradients of blocks that FSDP reshards after forward",
        ),
        (
            [
                "--parallelism.pipeline_parallel_schedule=ZBVZeroBubble",
                "--parallelism.pipeline_parallel_stages_per_rank=2",
                "--activation_checkpoint.mode=selective",
            ],
            {},
            "runs a second backward over each stage (its weight pass), which activation_checkpoint.mode='selective'",
        ),
        ([], {"tied": True}, "ties them (tie_embeddings, e.g. 1B/3B)"),
    ],
)
def test_constraint_messages(overrides, kwargs, message):
    with pytest.raises(UserError) as e:
        plan(*overrides, **kwargs)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_zero_bubble_runs_with_full_or_interval_checkpointing():
    """torch's split backward works under whole-block checkpointing (every block, or every N-th: selective with an
    integer option); only per-op selective checkpointing refuses its second backward."""
    zbv = [
        "--parallelism.pipeline_parallel_schedule=ZBVZeroBubble",
        "--parallelism.pipeline_parallel_stages_per_rank=2",
    ]
    for ac in (["--activation_checkpoint.mode=full"], ["--activation_checkpoint.mode=selective",
               "--activation_checkpoint.selective_ac_option=2"], ["--activation_checkpoint.mode=none"]):  # fmt: skip
        assert plan(*zbv, *ac).schedule == "ZBVZeroBubble"


def test_unknown_schedule_is_rejected_by_the_parser():
    with pytest.raises(
        UserError, match="pipeline_parallel_schedule' got 'Zigzag', expected 'GPipe' | '1F1B'"
    ):
        parse_args(["--parallelism.pipeline_parallel_schedule=Zigzag"])


def test_placement_loop_and_v():
    p = plan(
        "--parallelism.pipeline_parallel_schedule=Interleaved1F1B",
        "--parallelism.pipeline_parallel_stages_per_rank=2",
    )
    assert [p.stages_of_rank(r) for r in range(2)] == [[0, 2], [1, 3]]
    v = plan(
        "--parallelism.pipeline_parallel_schedule=ZBVZeroBubble",
        "--parallelism.pipeline_parallel_stages_per_rank=2",
    )
    assert [v.stages_of_rank(r) for r in range(2)] == [[0, 3], [1, 2]]  # rank 0 holds first and last


def test_stages_keep_names_and_chain_to_the_full_model():
    args = get_model_args("debugmodel")
    args.max_seq_len = 16
    torch.manual_seed(0)
    full = Transformer(args)
    full.init_weights(seed=3)
    ranges = even_split(args.n_layers, 4)
    stages = [stage_module(full, r, first=i == 0, last=i == 3) for i, r in enumerate(ranges)]
    for stage in stages:  # layout-independent init: a stage re-initialized alone gets the same values
        stage.init_weights(seed=3)
    names = [n for s in stages for n, _ in s.named_parameters()]
    assert sorted(names) == sorted(n for n, _ in full.named_parameters())  # every parameter once, same FQN
    assert stages[0].tok_embeddings is not None and stages[0].output is None and stages[0].norm is None
    assert stages[1].tok_embeddings is None and list(stages[1].layers.keys()) == ["1", "2"]
    tokens = torch.randint(0, args.vocab_size, (2, 16))
    h = tokens
    for stage in stages:
        h = stage(h)
    torch.testing.assert_close(h, full(tokens), rtol=0, atol=0)
