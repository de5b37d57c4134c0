"""Checkpoints that lose nothing: exact resume (1 process, FSDP 2, async), crashes at any point of a save,
preemption (SIGTERM -> exit 75), torchrun restarts, resharding, corrupt files, non-finite steps.

Every "identical" below is bitwise: fp32 on CPU, the resumed run's per-step losses equal the straight run's.
"""

import os
import shutil
import signal
import subprocess
import sys

import pytest

from conftest import (
    CKPT_ARGS,
    CKPT_ARGS2,
    CKPT_STEPS,
    ROOT,
    losses,
    run_train,
    steps_in,
    train_env,
    train_together,
)
from torchtitan.checkpoint import verify_checkpoint
from torchtitan.errors import UserError
from torchtitan.host_sync import EXIT_PREEMPTED
from torchtitan.launch import local_command
from torchtitan.metrics import read_tensorboard_scalars

STEPS, ARGS, ARGS2 = CKPT_STEPS, CKPT_ARGS, CKPT_ARGS2


def torchrun(nproc: int, args: list[str], extra: list[str] = (), env=None, timeout=600):
    r = subprocess.run(
        [*local_command(nproc, "train.py", tuple(extra)), *args],
        cwd=ROOT,
        env=env or train_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return r


def test_kill9_then_resume_is_bitwise_identical_async(straight1, tmp_path):
    """Async saves, a kill -9 after step 4: the restart resumes from step 3, and losses (JSONL and TensorBoard,
    read back with TensorBoard's reader) equal the uninterrupted run's, each step exactly once."""
    args = ARGS + [f"--job.dump_folder={tmp_path}", "--checkpoint.async_mode=async"]
    r = run_train(1, args, env=train_env(TORCHTITAN_TEST_FAULT="step_end:4"))
    assert r.returncode == -signal.SIGKILL
    assert steps_in(tmp_path) == [3]
    r = run_train(1, args)
    assert r.returncode == 0
    assert "resumed from" in r.stdout and "step 3" in r.stdout
    assert "blocked" in r.stdout  # the async save logs how long the loop was blocked
    assert losses(tmp_path) == losses(straight1)
    tb = read_tensorboard_scalars(tmp_path / "tb")["loss/global_avg"]
    ref = read_tensorboard_scalars(straight1 / "tb")["loss/global_avg"]
    assert [s for s, _ in tb] == list(range(1, STEPS + 1))  # no duplicate and no zig-zag after the resume
    assert tb == ref


@pytest.mark.parametrize("point", ["save_written", "save_marked"])
def test_kill9_during_save_keeps_previous_checkpoint(straight1, tmp_path, point):
    args = ARGS + [f"--job.dump_folder={tmp_path}"]
    r = run_train(1, args, env=train_env(TORCHTITAN_TEST_FAULT=f"{point}:6"))
    assert r.returncode == -signal.SIGKILL
    assert steps_in(tmp_path) == [3]  # the half-written step 6 is never picked
    leftovers = [n for n in os.listdir(tmp_path / "checkpoint") if ".tmp-" in n]
    assert len(leftovers) == (0 if point == "save_begin" else 1), leftovers
    if point != "save_marked":
        return
    r = run_train(1, args)  # resumes from 3, redoes 4..6, commits 6 and deletes the crashed leftover
    assert r.returncode == 0
    assert losses(tmp_path) == losses(straight1)
    assert steps_in(tmp_path) == [3, 6]
    assert not [n for n in os.listdir(tmp_path / "checkpoint") if ".tmp-" in n]


def test_sigterm_saves_exits_75_and_restart_continues(straight1, tmp_path):
    args = ARGS + [f"--job.dump_folder={tmp_path}", "--checkpoint.interval=100"]
    cmd = [sys.executable, "train.py", *args]
    p = subprocess.Popen(
        cmd, cwd=ROOT, env=train_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    for line in p.stdout:
        if "step      2" in line:
            p.send_signal(signal.SIGTERM)
            break
    rest = p.stdout.read()
    assert p.wait(timeout=300) == EXIT_PREEMPTED, rest
    (saved,) = steps_in(tmp_path)
    assert 2 <= saved < STEPS and "exiting 75" in rest
    r = run_train(1, args)
    assert r.returncode == 0 and f"step {saved}" in r.stdout
    assert losses(tmp_path) == losses(straight1)


def test_fsdp2_torchrun_restart_after_rank_killed_is_bitwise_identical(straight2, tmp_path):
    """FSDP 2; rank 1 is SIGKILLed after step 4; torchrun --max-restarts=1 restarts both ranks, which resume from
    step 3 and finish with the losses of the uninterrupted run (which saved asynchronously)."""
    args = ARGS2 + [f"--job.dump_folder={tmp_path}"]
    r = torchrun(2, args, ["--max-restarts=1"], env=train_env(TORCHTITAN_TEST_FAULT="step_end:4:1"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from" in r.stdout + r.stderr
    assert losses(tmp_path) == losses(straight2)
    assert steps_in(tmp_path) == [3, 6]


RESHARD = {
    "tp2": ["--parallelism.tensor_parallel_degree=2"],
    "pp2": ["--parallelism.pipeline_parallel_degree=2"],
}


@pytest.fixture(scope="module")
def resharded(straight2, tmp_path_factory):
    """straight2's step 3 resumed in each layout of RESHARD (both in one torchrun): the dump folders by layout."""
    root = tmp_path_factory.mktemp("reshard")
    for name in RESHARD:
        shutil.copytree(straight2 / "checkpoint" / "step-3", root / name / "checkpoint" / "step-3")
    runs = {name: [*ARGS2, "--training.local_batch_size=4", *layout] for name, layout in RESHARD.items()}
    return train_together(2, runs, root)


@pytest.mark.parametrize("layout", list(RESHARD))
def test_reshard_fsdp2_to_tp2_or_pp2(straight2, resharded, layout):
    """FSDP 2 checkpoint (async-saved) -> TP 2 (DTensor placements change) or PP 2 (each rank loads its stage's
    half of the parameters and optimizer state). The dp degree drops to 1; data.num_shards=2 keeps the data exact."""
    ref, got = losses(straight2), losses(resharded[layout])
    assert sorted(got) == [4, 5, 6]
    for s in got:
        assert got[s] == pytest.approx(ref[s], rel=1e-5, abs=1e-5), s


def test_reshard_fsdp2_to_one_process(straight2, tmp_path):
    """2 ranks -> 1: weights, optimizer and (with data.num_shards unchanged) the data position carry over exactly,
    so the losses continue the straight 2-rank run's. Without virtual shards the documented fallback applies:
    a warning, and the data stream restarts."""
    shutil.copytree(straight2 / "checkpoint" / "step-3", tmp_path / "a" / "checkpoint" / "step-3")
    r = run_train(1, ARGS2 + [f"--job.dump_folder={tmp_path / 'a'}", "--training.local_batch_size=4"])
    assert r.returncode == 0
    assert "saved by 2 ranks" in r.stdout
    ref, got = losses(straight2), losses(tmp_path / "a")
    assert sorted(got) == [4, 5, 6]
    for s in got:
        assert got[s] == pytest.approx(ref[s], rel=1e-5, abs=1e-5), s
    shutil.copytree(straight2 / "checkpoint" / "step-3", tmp_path / "b" / "checkpoint" / "step-3")
    r = run_train(
        1,
        ARGS + [f"--job.dump_folder={tmp_path / 'b'}", "--training.steps=4", "--training.local_batch_size=4"],
    )
    assert r.returncode == 0 and "data is replayed" in r.stdout


def test_one_process_checkpoint_resumes_under_fsdp2(straight2, tmp_path):
    """1 process -> 2 ranks: a checkpoint of the unwrapped single-process model (plain tensors: no FSDP with one
    dp rank) resumes under FSDP 2 (DTensor shards) and continues the straight 2-rank run's losses."""
    one = tmp_path / "one"
    r = run_train(1, ARGS2 + [f"--job.dump_folder={one}", "--training.local_batch_size=4"])
    assert r.returncode == 0 and steps_in(one) == [3, 6]
    # the same run length (the LR schedule depends on it), resumed from step 3
    shutil.copytree(one / "checkpoint" / "step-3", tmp_path / "two" / "checkpoint" / "step-3")
    r = run_train(2, ARGS2 + [f"--job.dump_folder={tmp_path / 'two'}"])
    assert r.returncode == 0
    assert "saved by 1 rank" in r.stdout + r.stderr
    ref, got = losses(straight2), losses(tmp_path / "two")
    assert sorted(got) == [4, 5, 6]
    for s in got:
        assert got[s] == pytest.approx(ref[s], rel=1e-5, abs=1e-5), s


def test_missing_truncated_corrupt_files(straight1, tmp_path):
    ck = tmp_path / "checkpoint"
    shutil.copytree(straight1 / "checkpoint", ck)
    data = ck / "step-6" / "__0_0.distcp"
    verify_checkpoint(str(ck / "step-6"))
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size - 10)
    with pytest.raises(UserError, match=r"__0_0.distcp has \d+ bytes, expected"):
        verify_checkpoint(str(ck / "step-6"))
    data.unlink()
    with pytest.raises(UserError, match=r"__0_0.distcp is missing"):
        verify_checkpoint(str(ck / "step-6"))
    # End to end: a corrupt per-rank JSON of the same size; the run stops with one line naming the file and
    # writes nothing (no checkpoint, no metrics overwritten).
    shutil.rmtree(ck / "step-6")
    js = ck / "step-3" / "train_state" / "rank-0.json"
    good = js.read_bytes()
    js.write_bytes(b"x" * js.stat().st_size)
    before = sorted(p.name for p in ck.iterdir())
    r = run_train(1, ARGS + [f"--job.dump_folder={tmp_path}"])
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()[-1:]
    assert (
        line.startswith("error: checkpoint file") and "rank-0.json of step 3 is corrupt" in line
    )  # checksum
    assert sorted(p.name for p in ck.iterdir()) == before
    meta = ck / "step-3" / ".metadata"
    meta.write_bytes(b"\0" * meta.stat().st_size)
    js.write_bytes(good)
    r = run_train(1, ARGS + [f"--job.dump_folder={tmp_path}"])
    assert r.returncode == 2 and ".metadata is unreadable" in r.stderr


def test_nonfinite_loss_stops_without_checkpoint_or_skips_and_keep_latest_k(tmp_path):
    args = ARGS + ["--checkpoint.interval=2"]
    r = run_train(
        1, args + [f"--job.dump_folder={tmp_path / 'stop'}"], env=train_env(TORCHTITAN_TEST_NAN_STEP="3")
    )
    assert r.returncode == 3
    assert "non-finite loss or grad norm at step 3" in r.stderr.strip().splitlines()[-1]
    assert steps_in(tmp_path / "stop") == [2]
    r = run_train(
        1,
        args
        + [
            f"--job.dump_folder={tmp_path / 'skip'}",
            "--training.skip_nonfinite_steps=true",
            "--checkpoint.keep_latest_k=2",
        ],
        env=train_env(TORCHTITAN_TEST_NAN_STEP="3"),
    )
    assert r.returncode == 0 and "step 3: non-finite" in r.stdout + r.stderr
    assert steps_in(tmp_path / "skip") == [4, 6]  # keep_latest_k=2 deleted step 2
    assert sorted(os.listdir(tmp_path / "skip" / "checkpoint")) == ["step-4", "step-6"]


def test_seed_checkpoint_then_run_from_it(straight1, tmp_path):
    r = run_train(1, ARGS + [f"--job.dump_folder={tmp_path}", "--checkpoint.create_seed_checkpoint=true"])
    assert r.returncode == 0 and steps_in(tmp_path) == [0]
    assert not (tmp_path / "metrics.jsonl").exists() or not losses(tmp_path)  # no training step ran
    r = run_train(1, ARGS + [f"--job.dump_folder={tmp_path}", "--training.steps=1", "--training.seed=7"])
    assert r.returncode == 0 and "loaded model weights from" in r.stdout
    # seed 7 would initialize other weights: the step-1 loss equals seed 0's because the weights came from step-0
    assert losses(tmp_path)[1] == losses(straight1)[1]
