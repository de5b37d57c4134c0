"""ParallelDims.validate: every constraint has a message naming the numbers and a fix (no processes needed)."""

import pytest

from torchtitan.config import parse_args
from torchtitan.errors import UserError
from torchtitan.models import model_args_from_config
from torchtitan.parallel.dims import ParallelDims
from torchtitan.preflight import check_mesh, preflight

DEBUG = ["--job.config_file=train_configs/debug_model.toml", "--training.seq_len=64"]


def check(world: int, *overrides: str, device: str | None = None):
    cfg = parse_args([*DEBUG, *overrides])
    dims = ParallelDims.from_config(cfg.parallelism, world)
    dims.validate(model_args_from_config(cfg.model, cfg.training.seq_len), cfg, device)
    return dims


def test_valid_layouts_pass():
    check(1)
    check(8, "--parallelism.tensor_parallel_degree=4", "--parallelism.data_parallel_replicate_degree=2")
    dims = check(4, "--training.local_batch_size=2", "--training.global_batch_size=32")
    assert dims.grad_accumulation_steps(parse_args([*DEBUG, "--training.local_batch_size=2"]).training) == 1
    cfg = parse_args([*DEBUG, "--training.local_batch_size=2", "--training.global_batch_size=32"])
    assert dims.global_batch_size(cfg.training) == 32 and dims.grad_accumulation_steps(cfg.training) == 4


@pytest.mark.parametrize(
    "world, overrides, message",
    [
        (
            6,
            ["--parallelism.tensor_parallel_degree=4"],
            "world size 6 is not divisible by dp_replicate 1 x cp 1 x tp 4 x pp 1 = 4",
        ),
        (
            4,
            ["--parallelism.tensor_parallel_degree=2", "--parallelism.data_parallel_shard_degree=3"],
            "= 6, but the world size is 4; make the degrees multiply to 4",
        ),
        # debugmodel: 16 heads, 4 kv heads, ffn 768, vocab 2048
        (
            8,
            ["--parallelism.tensor_parallel_degree=8"],
            "model n_kv_heads=4 is not divisible by tensor_parallel_degree 8",
        ),
        (
            3,
            ["--parallelism.tensor_parallel_degree=3"],
            "model n_heads=16 is not divisible by tensor_parallel_degree 3",
        ),
        (
            2,
            ["--parallelism.tensor_parallel_degree=2", "--model.vocab_size=2049", "--training.seq_len=64"],
            "vocab_size=2049 is not divisible by tensor_parallel_degree 2",
        ),
        (
            4,
            ["--parallelism.tensor_parallel_degree=4", "--training.seq_len=66"],
            "training.seq_len=66 is not divisible by tensor_parallel_degree 4 (sequence parallel",
        ),
        (
            2,
            ["--parallelism.context_parallel_degree=2", "--training.seq_len=66"],
            "training.seq_len=66 is not divisible by 2 x context_parallel_degree = 4",
        ),
        (
            8,
            [
                "--parallelism.context_parallel_degree=2",
                "--parallelism.tensor_parallel_degree=4",
                "--training.seq_len=20",
            ],
            "training.seq_len=20 / context_parallel_degree 2 = 10 tokens per cp rank is not divisible by"
            " tensor_parallel_degree 4 (sequence parallel); use a seq_len that is a multiple of 16",
        ),
        (
            2,
            ["--training.local_batch_size=2", "--training.global_batch_size=6"],
            "training.global_batch_size=6 is not a multiple of local_batch_size 2 x dp 2 = 4"
            " (sequences per micro-step); use 4 or 8",
        ),
        (
            4,
            ["--training.local_batch_size=2", "--training.global_batch_size=4"],
            "global_batch_size=4 is not a multiple of local_batch_size 2 x dp 4 = 8",
        ),
        (
            2,
            ["--parallelism.tensor_parallel_degree=2", "--model.flavor=1B"],
            "with tied embeddings (flavor 1B) is not supported",
        ),
    ],
)
def test_messages_name_numbers_and_fix(world, overrides, message):
    with pytest.raises(UserError) as e:
        check(world, *overrides)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_seq_len_free_without_sequence_parallel():
    check(
        4,
        "--parallelism.tensor_parallel_degree=4",
        "--training.seq_len=66",
        "--parallelism.enable_sequence_parallel=false",
    )


def test_gpu_only_features_rejected_on_cpu():
    with pytest.raises(UserError, match="context parallel needs CUDA"):
        check(2, "--parallelism.context_parallel_degree=2", device="cpu")
    with pytest.raises(UserError, match="fsdp_cpu_offload=true needs CUDA"):
        check(1, "--parallelism.fsdp_cpu_offload=true", device="cpu")
    check(2, "--parallelism.context_parallel_degree=2")  # no device known (preflight): the shapes are fine


def test_preflight_runs_the_same_checks():
    with pytest.raises(UserError, match="n_kv_heads=4 is not divisible by tensor_parallel_degree 8"):
        check_mesh(parse_args([*DEBUG, "--parallelism.tensor_parallel_degree=8"]), 8)
    with pytest.raises(UserError, match="pipeline"):
        check_mesh(parse_args([*DEBUG, "--parallelism.pipeline_parallel_degree=8"]), 8)  # 6 layers < 8 stages
    assert preflight(["--world_size=8", *DEBUG, "--parallelism.tensor_parallel_degree=8"]) == 2
    assert preflight(["--world_size=4", *DEBUG, "--parallelism.tensor_parallel_degree=2"]) == 0


def test_float8_micro_batch_tokens_must_be_divisible_by_16(capsys):
    """torch._scaled_mm contracts over the micro-batch's tokens in the weight-gradient GEMM: checked before any
    allocation (one line, exit 2 from preflight), with context parallel's split and PP's micro-batch size."""
    f8 = ["--float8.enable=true"]
    with pytest.raises(UserError) as e:
        check(1, *f8, "--training.local_batch_size=1", "--training.seq_len=40")
    assert str(e.value).startswith(
        "float8: training.local_batch_size=1 x training.seq_len=40 = 40 tokens per micro-batch and rank is not"
        " divisible by 16"
    )
    with pytest.raises(UserError, match=r"seq_len=48 / context_parallel_degree 2 = 24 tokens"):
        check(
            2,
            *f8,
            "--training.local_batch_size=1",
            "--training.seq_len=48",
            "--parallelism.context_parallel_degree=2",
        )
    with pytest.raises(UserError, match="pipeline_parallel_microbatch_size=1 x training.seq_len=24"):
        check(2, *f8, "--training.seq_len=24", "--parallelism.pipeline_parallel_degree=2")
    check(1, *f8, "--training.local_batch_size=1", "--training.seq_len=48")  # 48 tokens: fine
    check(
        2,
        *f8,
        "--training.local_batch_size=1",
        "--training.seq_len=64",
        "--parallelism.context_parallel_degree=2",
    )
    check(
        1, *f8, "--training.local_batch_size=1", "--training.seq_len=40", "--float8.emulate=true"
    )  # no _scaled_mm
    check(1, "--training.local_batch_size=1", "--training.seq_len=40")  # no float8, no constraint
    bad = ["--world_size=1", *DEBUG, *f8, "--training.local_batch_size=1", "--training.seq_len=40"]
    assert preflight(bad) == 2
    printed = capsys.readouterr()
    assert "not divisible by 16" in printed.out + printed.err
