"""scripts/multinode_trainer.slurm under a real SLURM: a controller and two slurmd "nodes" on this machine.

scripts/ci/start_slurm.sh installs SLURM (apt-get, root) when it is missing and starts the daemons; where that
is impossible (not root, no apt) the tests skip and say why. Runtime: ~1 min apt install on a fresh machine,
then ~2-3 min for both jobs on 2 cores.
"""

from __future__ import annotations

import importlib.util
import os
import random
import re
import socket
import subprocess
import time

import pytest

from conftest import FIXED_PEAK, ROOT, TINY, train_env

STEPS = ["--training.steps=5", "--lr_scheduler.warmup_steps=2", FIXED_PEAK]  # FIXED_PEAK: no check reads MFU


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    d = tmp_path_factory.mktemp("slurm")
    while True:  # ports away from a system SLURM's and from other test runs on this machine
        base = random.randrange(20000, 28000)
        if all(_free(p) for p in (base, base + 1, base + 2)):
            break
    env = dict(os.environ, SLURM_CTLD_PORT=str(base), SLURM_NODE_PORT=str(base + 1))
    r = subprocess.run(
        [str(ROOT / "scripts/ci/start_slurm.sh"), str(d)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if r.returncode == 77:
        pytest.skip(r.stderr.strip().splitlines()[-1])
    try:
        assert r.returncode == 0, r.stderr
        conf = str(d / "slurm.conf")
        yield d, conf
    finally:
        subprocess.run([str(ROOT / "scripts/ci/stop_slurm.sh"), str(d)], timeout=60)


def job_env(conf: str, **extra) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return train_env(SLURM_CONF=conf, LOG_RANK="all", RDZV_PORT=str(port), **extra)


def sbatch(env: dict, out, args: list[str]) -> str:
    cmd = ["sbatch", "--parsable", f"--output={out}", "scripts/multinode_trainer.slurm", *args]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True)
    return r.stdout.strip().split(";")[0]


def job_info(env: dict, job: str) -> dict:
    text = subprocess.run(
        ["scontrol", "show", "job", job], env=env, capture_output=True, text=True, timeout=30
    ).stdout
    return dict(re.findall(r"(\w+)=(\S+)", text))


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def finished(env: dict, job: str) -> str | None:
    state = job_info(env, job).get("JobState")
    return state if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL") else None


@pytest.fixture(scope="module")
def jobs(slurm, tmp_path_factory):
    """Both jobs are submitted at once: each takes one core on each of the two nodes, so they run side by side."""
    _, conf = slurm
    d = tmp_path_factory.mktemp("jobs")
    plain_env = job_env(conf)
    plain = sbatch(plain_env, d / "plain.out", TINY + STEPS + [f"--job.dump_folder={d / 'plain'}"])
    # Step 3 takes 10 s so that the preemption signal lands mid-run.
    pre_env = job_env(conf, TORCHTITAN_TEST_STALL_AT_STEP="3", TORCHTITAN_TEST_STALL_SECONDS="10")
    args = TINY + STEPS + [f"--job.dump_folder={d / 'preempted'}", "--checkpoint.enable=true"]
    preempted = sbatch(pre_env, d / "preempted.out", args)
    return d, {"plain": (plain, plain_env), "preempted": (preempted, pre_env)}


def test_two_node_job_trains_to_completion(jobs):
    d, ids = jobs
    job, env = ids["plain"]
    state = wait_for(lambda: finished(env, job), 600, f"job {job} to finish")
    text = (d / "plain.out").read_text()
    assert state == "COMPLETED", text[-4000:]
    assert "2 node(s) x 1 process(es)" in text
    assert "preflight ok" in text
    # One world across both nodes: both ranks train and the loss is the global one on both.
    assert "world 2 = pp 1 x dp_replicate 1 x dp_shard 2" in text
    for rank in (0, 1):
        assert re.search(rf"\[rank{rank}\] \S+ INFO training finished after 5 steps", text), text[-4000:]
        assert (d / "plain" / "logs" / f"rank{rank}.log").exists()
    losses = re.findall(r"\[rank(\d)\] \S+ INFO step\s+5\s+loss\s+(\S+)", text)
    assert len(losses) == 2 and losses[0][1] == losses[1][1]


def test_preempted_job_checkpoints_requeues_and_resumes(jobs):
    """USR1 to the batch shell (what `#SBATCH --signal=B:USR1@N` does before the time limit) -> TERM to the
    trainers -> checkpoint at the end of the step, exit 75 -> `scontrol requeue` -> the same job runs again."""
    d, ids = jobs
    job, env = ids["preempted"]
    out = d / "preempted.out"
    wait_for(lambda: out.exists() and "stalls in step 3" in out.read_text(), 300, "step 3")
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], env=env, check=True, timeout=30)

    def requeued():
        info = job_info(env, job)
        return info.get("Restarts") == "1" and info.get("JobState") in ("PENDING", "RUNNING", "COMPLETED")

    wait_for(requeued, 300, f"job {job} to be requeued")
    # SLURM starts a requeued job once its revoked credential has expired (AuthInfo=cred_expire, 10 s on the
    # test cluster: scripts/ci/start_slurm.sh). Forcing StartTime=now before that made the job fail at times:
    # "Killing non-startable batch JobId=2: Job credential revoked" (ctld.log).
    state = wait_for(lambda: finished(env, job), 600, f"requeued job {job} to finish")
    text = out.read_text()  # --open-mode=append: both attempts are in the file
    assert state == "COMPLETED", text[-4000:]
    first, _, second = text.partition(f"job {job} restart 1:")
    assert f"job {job} restart 0:" in first and second, text[-4000:]
    assert "USR1 received; asking the trainers to checkpoint and stop" in first
    assert "preempted" in first and f"requeueing job {job}" in first
    assert "training finished after 5 steps" not in first
    assert "training finished after 5 steps" in second
    first_step_of_second = int(re.search(r"\] \S+ INFO step\s+(\d+)", second).group(1))
    if importlib.util.find_spec("torchtitan.checkpoint") is not None:
        # With checkpointing (the checkpoint issue's contract) the step the signal landed in finished and was saved
        # before the trainers exited with 75, and the requeued run resumed after it instead of starting over.
        # (torchrun reports any failed worker as its own exit code 1, so the 75 is read from the trainers' logs)
        # That step is the stalled step 3, or step 4 when the signal took longer than the 10 s stall to reach the
        # trainers (a loaded host: the test of 2026-12-03 beside two other pytest runs).
        assert re.search(r"\[rank\d\] \S+ WARNING .*\b75\b", first), first[-4000:]
        saved = [int(n) for n in re.findall(r"\] \S+ INFO checkpoint step-(\d+) (?:\(\w+\) )?saved", first)]
        assert saved and saved[-1] in (3, 4), first[-4000:]
        assert first_step_of_second == saved[-1] + 1, second[:4000]
    else:
        # Without a checkpoint module the requeued job can only start over; everything else above holds.
        assert first_step_of_second == 1
