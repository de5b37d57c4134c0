"""Validation loss: fixed held-out batches, the same number in every layout, training untouched; and the
perplexity command over the checkpoints those runs write (model-only export and full checkpoint).

Every run: the debug model, fp32, seq_len 64, 4 steps, a training global batch of 4 sequences (data.num_shards=4,
as in tests/test_parity.py) and a validation set of 3 global batches of 4 sequences of the debug corpus's
validation split, evaluated at steps 2 and 4. Same tolerance as the training parity tests (RTOL 1e-5: the layouts
differ only in the order of floating-point sums; a wrong reduction, a missing rank's share or different batches
move the loss by far more, e.g. counting the tp ranks twice doubles it).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from test_parity import layout_rows

from conftest import ROOT, run_script, train_env

sys.path.insert(0, str(ROOT / "scripts"))
from loss_compare import run  # noqa: E402

RTOL = 1e-5
STEPS = 4
COMMON = [
    "--job.config_file=train_configs/debug_model.toml",
    f"--training.steps={STEPS}",
    "--training.seq_len=64",
    "--lr_scheduler.warmup_steps=2",
    "--data.num_shards=4",
    "--metrics.peak_tflops=1",  # no calibration: these runs are about numbers, not speed
]
VALIDATION = ["--validation.enable=true", "--validation.freq=2", "--validation.steps=3"]
CKPT = ["--checkpoint.enable=true", "--checkpoint.interval=2", "--checkpoint.last_save_model_only=true"]
LAYOUTS = {
    "fsdp2": (2, ["--training.local_batch_size=2"]),
    "tp2": (2, ["--training.local_batch_size=4", "--parallelism.tensor_parallel_degree=2"]),
    "pp2": (2, ["--training.local_batch_size=4", "--parallelism.pipeline_parallel_degree=2"]),
}


def validation(rows: list[dict]) -> dict[int, float]:
    return {r["step"]: r["validation/loss"] for r in rows if "validation/loss" in r}


def training(rows: list[dict]) -> list[tuple[int, float, float]]:
    return [(r["step"], r["loss/global_avg"], r["grad_norm"]) for r in rows]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    return out, run(1, [*COMMON, "--training.local_batch_size=4", *VALIDATION, *CKPT], str(out))


def test_validation_at_freq_and_end_and_repeatable(single, tmp_path):
    """Steps 2 and 4 (freq and the last step); a second run with the same seed gives the same numbers, bit for bit;
    perplexity = exp(loss); the training curve falls and so does the held-out loss."""
    out, rows = single
    val = validation(rows)
    assert sorted(val) == [2, 4]
    assert val[4] < val[2] < 8.0  # ln(2048) = 7.6 at init; both fall as training proceeds
    for r in rows:
        if "validation/loss" in r:
            assert r["validation/perplexity"] == pytest.approx(
                2.718281828459045 ** r["validation/loss"], rel=1e-9
            )
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # one JSONL line per step, validation merged into it
    again = run(1, [*COMMON, "--training.local_batch_size=4", *VALIDATION], str(tmp_path / "again"))
    assert validation(again) == val


def test_training_unchanged_by_validation(single, tmp_path):
    """Same seed without validation: every training loss and grad norm is bitwise the same (no RNG drawn, no
    data consumed, no optimizer or model state touched by the evaluation)."""
    _, rows = single
    plain = run(1, [*COMMON, "--training.local_batch_size=4"], str(tmp_path / "plain"))
    assert training(plain) == training(rows)
    assert not validation(plain)


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """The 2-process runs in one torchrun (test_parity.layout_rows): LAYOUTS and CP 2, whose CPU kernel
    tests/dist/train_many.py registers as tests/dist/train_cp_cpu.py does."""
    cp2 = ["--training.local_batch_size=4", "--parallelism.context_parallel_degree=2"]
    return layout_rows(
        {**LAYOUTS, "cp2": (2, cp2)}, tmp_path_factory.mktemp("layouts"), [*COMMON, *VALIDATION]
    )


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_validation_same_in_every_layout(single, layouts, layout):
    rows = layouts[layout]
    base, got = validation(single[1]), validation(rows)
    assert sorted(got) == sorted(base)
    for step in base:
        assert got[step] == pytest.approx(base[step], rel=RTOL), (layout, step, got[step], base[step])
    # and training after a validation pass goes on as in one process (pipeline schedules switch eval -> train)
    for (step, loss, norm), (_, loss1, norm1) in zip(training(rows), training(single[1])):
        assert loss == pytest.approx(loss1, rel=RTOL) and norm == pytest.approx(norm1, rel=RTOL), (
            layout,
            step,
        )


def test_validation_under_context_parallel(single, layouts):
    """CP 2 (through the test-only CPU kernel registration of tests/test_parity_cp.py): each cp rank's share
    of every sequence is added up; the cached batches are not sharded in place between evaluations."""
    base, got = validation(single[1]), validation(layouts["cp2"])
    assert sorted(got) == [2, 4]
    for step in base:
        assert got[step] == pytest.approx(base[step], rel=RTOL), (step, got[step], base[step])


def perplexity(nproc: int, args: list[str], tmp_path):
    out = tmp_path / f"ppl{nproc}.json"
    fp32 = "--training.mixed_precision_param=float32"  # as loss_compare.run trains
    common = [a for a in COMMON if not a.startswith("--metrics")] + [fp32]
    r = run_script(
        nproc, "scripts/perplexity.py", [*common, *VALIDATION, *args, f"--json={out}"], timeout=300
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(out.read_text()), r.stdout


def test_perplexity_of_export_one_process(single, tmp_path):
    """The model-only export of step 4, one process: exactly the validation loss the trainer logged at step 4."""
    out, rows = single
    result, stdout = perplexity(
        1, [f"--checkpoint={out}/checkpoint/step-4", "--training.local_batch_size=4"], tmp_path
    )
    assert result["step"] == 4 and result["tokens"] == 3 * 4 * 64 and result["world_size"] == 1
    assert result["loss"] == validation(rows)[4]
    assert result["perplexity"] == pytest.approx(2.718281828459045 ** result["loss"], rel=1e-9)
    assert stdout.splitlines()[-1].startswith("perplexity ")


def test_perplexity_of_full_checkpoint_tensor_parallel(single, tmp_path):
    """The full checkpoint of step 2 (saved by 1 process), read by TP 2: the step-2 validation loss."""
    out, rows = single
    args = [f"--checkpoint={out}/checkpoint/step-2", "--training.local_batch_size=4"]
    result, _ = perplexity(2, [*args, "--parallelism.tensor_parallel_degree=2"], tmp_path)
    assert result["step"] == 2 and result["world_size"] == 2
    assert result["loss"] == pytest.approx(validation(rows)[2], rel=RTOL)


def test_the_validation_set_does_not_depend_on_the_layout():
    """dp 1 and dp 2 (any local batch): the same sequences, dp rank r holding its slice of every global batch."""
    from torchtitan.config import parse_args
    from torchtitan.data import build_tokenizer
    from torchtitan.evaluate import load_validation_batches
    from torchtitan.parallel import ParallelDims

    def batches(dp, local):
        cfg = parse_args(
            [
                *COMMON,
                f"--training.local_batch_size={local}",
                "--validation.global_batch_size=4",
                "--validation.steps=5",
            ]
        )
        dims = ParallelDims(dp_replicate=1, dp_shard=dp, cp=1, tp=1, pp=1, world_size=dp)
        tok = build_tokenizer(cfg.model.tokenizer_path)
        return [load_validation_batches(cfg, tok, dims, r) for r in range(dp)]

    (one,) = batches(1, 4)
    two = batches(2, 1)  # dp 2, micro-batches of 1 sequence
    assert len(one) == 5 and all(x.shape == (4, 64) for x, _ in one)
    rows_one = torch.cat([x for x, _ in one])
    # global batch b: rank 0 holds its rows 0-1, rank 1 rows 2-3
    rows_two = torch.cat(
        [
            torch.cat(
                [*(x for x, _ in two[0][2 * b : 2 * b + 2]), *(x for x, _ in two[1][2 * b : 2 * b + 2])]
            )
            for b in range(5)
        ]
    )
    assert torch.equal(rows_one, rows_two)
    assert torch.equal(one[0][0][:, 1:], one[0][1][:, :-1])  # labels are the inputs shifted by one


def test_errors_are_one_line(tmp_path):
    """A missing checkpoint (perplexity), training on one's own files without held-out files (trainer), a
    validation set larger than the split, a global batch the dp ranks cannot share: one line each, exit 2."""
    from torchtitan.config import parse_args
    from torchtitan.data import build_tokenizer
    from torchtitan.errors import UserError
    from torchtitan.evaluate import load_validation_batches
    from torchtitan.parallel import ParallelDims

    missing = tmp_path / "nope"
    cmd = [sys.executable, "scripts/perplexity.py", *COMMON, f"--checkpoint={missing}"]
    r = subprocess.run(cmd, cwd=ROOT, env=train_env(), capture_output=True, text=True, timeout=120)
    assert (
        r.returncode == 2
        and r.stderr.strip() == f"error: --checkpoint {missing} does not exist or is not a folder"
    )

    train = [sys.executable, "train.py", *COMMON, f"--job.dump_folder={tmp_path}"]
    own = ["--validation.enable=true", f"--data.dataset_path={ROOT}/tests/assets/debug_corpus/train.jsonl"]
    r = subprocess.run([*train, *own], cwd=ROOT, env=train_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().startswith(
        "error: 'validation.dataset_path' = None is invalid:"
    )

    dims = ParallelDims(dp_replicate=1, dp_shard=2, cp=1, tp=1, pp=1, world_size=2)
    cfg = parse_args([*COMMON, "--training.local_batch_size=2", "--validation.steps=100000"])
    tok = build_tokenizer(cfg.model.tokenizer_path)
    with pytest.raises(UserError) as e:
        load_validation_batches(cfg, tok, dims, 0)
    assert str(e.value).startswith("validation data (data.dataset debug_corpus, split validation) holds ")
    assert str(e.value).endswith(
        "fewer than validation.steps=100000; lower validation.steps or validation.global_batch_size, or use"
        " more held-out data"
    )
    cfg = parse_args([*COMMON, "--training.local_batch_size=2", "--validation.global_batch_size=6"])
    with pytest.raises(
        UserError,
        match=r"validation.global_batch_size=6 is not a multiple of training.local_batch_size 2 x dp 2 = 4",
    ):
        load_validation_batches(cfg, tok, dims, 0)
