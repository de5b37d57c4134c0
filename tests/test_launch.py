"""Launch paths: two torchrun "nodes" on this machine, ranks that never join, stalled steps, wrong node counts."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from conftest import FIXED_PEAK, ROOT, TINY, run_train, train_env

BASE = [*TINY, FIXED_PEAK]  # no check here reads MFU


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def losses(folder) -> list[float]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [r["loss/global_avg"] for r in rows]


def torchrun_node(node_rank: int, nnodes: int, port: int, args: list[str], env: dict) -> subprocess.Popen:
    """One torchrun 'node': its own agent, joining the others through the c10d rendezvous on localhost."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        f"--nnodes={nnodes}", "--nproc_per_node=1", "--rdzv_backend=c10d",
        f"--rdzv_endpoint=localhost:{port}", "--rdzv_id=test-two-nodes", f"--node_rank={node_rank}",
        "train.py", *args,
    ]  # fmt: skip
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def test_two_torchrun_nodes_match_one_node(tmp_path):
    steps = ["--training.steps=4", "--lr_scheduler.warmup_steps=2"]
    one = run_train(2, BASE + steps + [f"--job.dump_folder={tmp_path / 'one'}"])
    assert one.returncode == 0, one.stdout[-3000:]

    port = free_port()
    args = BASE + steps + [f"--job.dump_folder={tmp_path / 'two'}", "--job.expected_nodes=2"]
    env = train_env(LOG_RANK="1")  # only rank 1 prints; every rank still writes its log file
    nodes = [torchrun_node(i, 2, port, args, env) for i in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outs[0][-3000:] + outs[1][-3000:]

    # Same world size, same seed, same data: the two-node run is the one-node run, step for step.
    assert losses(tmp_path / "two") == pytest.approx(losses(tmp_path / "one"), rel=1e-6, abs=1e-6)
    # Every rank's log is kept, each line prefixed with its rank; rank 1 ran in the second torchrun.
    logs = tmp_path / "two" / "logs"
    assert "[rank0]" in (logs / "rank0.log").read_text()
    assert "[rank1]" in (logs / "rank1.log").read_text()
    assert "[rank1]" in outs[1] and "[rank0]" not in outs[0] + outs[1]  # LOG_RANK=1 picks the console ranks


def test_wrong_node_count_fails_at_once_with_both_numbers(tmp_path):
    r = run_train(2, BASE + [f"--job.dump_folder={tmp_path}", "--job.expected_nodes=2"], timeout=300)
    assert r.returncode != 0
    assert "job.expected_nodes is 2 but the launcher formed a world of 1 node(s) (2 processes)" in r.stderr


def test_rank_that_never_joins_is_named(tmp_path):
    env = train_env(TORCHTITAN_TEST_NEVER_JOIN="1", TORCHTITAN_TEST_RANK="1", LOG_RANK="all")
    args = BASE + [f"--job.dump_folder={tmp_path}", "--comm.init_timeout_seconds=8"]
    r = run_train(2, args, env=env, timeout=300)
    assert r.returncode != 0
    msg = "rank 0: rank(s) 1 of 2 did not join within 8 s (comm.init_timeout_seconds)"
    assert msg in r.stderr
    assert msg in (tmp_path / "logs" / "rank0.log").read_text()


def test_stalled_step_watchdog_dumps_stacks_and_exits(tmp_path):
    # Rank 1 sleeps inside step 3; rank 0 waits for it in a collective. Both watchdogs fire before the
    # collective timeout: each rank's log gets every thread's stack, and the job ends with the hang exit code.
    env = train_env(TORCHTITAN_TEST_STALL_AT_STEP="3", TORCHTITAN_TEST_RANK="1", LOG_RANK="all")
    args = BASE + [
        f"--job.dump_folder={tmp_path}",
        "--training.steps=6",
        "--comm.watchdog_timeout_seconds=6",
        "--comm.init_timeout_seconds=60",
        "--comm.train_timeout_seconds=300",
    ]
    r = run_train(2, args, env=env, timeout=400)
    assert r.returncode != 0
    log1 = (tmp_path / "logs" / "rank1.log").read_text()
    log0 = (tmp_path / "logs" / "rank0.log").read_text()
    assert "watchdog: rank 1: no training step completed in 6 s (last completed step 2)" in log1
    assert "Python stacks of all threads" in log1 and "hook_stall" in log1  # the stalled frame is in the dump
    assert "watchdog: rank 0: no training step completed in 6 s (last completed step 2)" in log0
    assert "Thread 0x" in log0  # faulthandler's per-thread header
    assert "exitcode  : 3" in r.stderr or "exitcode: 3" in r.stderr.replace(" ", "")


def test_subgroup_collective_timeout_names_rank_and_last_step(tmp_path):
    """A hang in a mesh SUB-group's collective (FSDP 2 x TP 2: the tp and fsdp groups are not the default group)
    fails within the training timeout, which every process group gets after the first step; watchdog off.
    Rank 1 sleeps 20 s, four times the timeout, then finds its peers gone and leaves: a rank asleep for good would
    hold torchrun for its fixed 30 s grace before the SIGKILL."""
    env = train_env(
        TORCHTITAN_TEST_STALL_AT_STEP="2",
        TORCHTITAN_TEST_STALL_SECONDS="20",
        TORCHTITAN_TEST_RANK="1",
        LOG_RANK="all",
    )
    args = BASE + [
        f"--job.dump_folder={tmp_path}",
        "--training.steps=4",
        "--parallelism.tensor_parallel_degree=2",
        "--comm.watchdog_timeout_seconds=0",
        "--comm.train_timeout_seconds=5",
    ]
    r = run_train(4, args, env=env, timeout=400)
    assert r.returncode != 0
    assert "rank 0: collective failed in step 2 (last completed step 1)" in r.stderr
    assert "5000ms" in r.stderr  # gloo names the timeout that fired: the training one, not the 30 min default


def test_first_step_runs_under_the_init_timeout(tmp_path):
    """Step 1 (compile, warm-up, lazy init) may take longer than the training timeout: a rank 8 s late in step 1
    is fine under the 60 s init timeout, although the training timeout is 3 s."""
    env = train_env(
        TORCHTITAN_TEST_STALL_AT_STEP="1", TORCHTITAN_TEST_STALL_SECONDS="8", TORCHTITAN_TEST_RANK="1"
    )
    args = BASE + [
        f"--job.dump_folder={tmp_path}",
        "--training.steps=2",
        "--comm.watchdog_timeout_seconds=0",
        "--comm.init_timeout_seconds=60",
        "--comm.train_timeout_seconds=3",
    ]
    r = run_train(2, args, env=env, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "collective timeout now 3 s" in r.stdout + r.stderr


def test_more_ranks_than_gpus_is_one_clear_line(monkeypatch):
    """torchrun --nproc_per_node above the node's GPU count: the extra rank says so (a UserError: one line, exit 2)
    instead of CUDA's "invalid device ordinal" traceback. Seen on a 1-GPU machine with 2 ranks."""
    import torch

    from torchtitan.errors import UserError
    from torchtitan.parallel.distributed import pick_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with pytest.raises(UserError) as e:
        pick_device()
    msg = str(e.value)
    assert "local rank 1" in msg and "1 CUDA device" in msg and "CUDA_VISIBLE_DEVICES=3" in msg
    assert "--nproc_per_node" in msg and "\n" not in msg


def test_exit_process_runs_the_exit_handlers_and_keeps_the_code(tmp_path):
    """The entry points leave through exit_process (torchtitan/parallel/distributed.py): the atexit handlers still
    run (logging's shutdown, pytest-cov's data), buffered output is flushed, the exit code is kept, and None means
    0 as with sys.exit -- only the interpreter's final teardown, where C++ statics abort, is skipped."""
    marker = tmp_path / "atexit_ran"
    code = (
        "import atexit, sys\n"
        "from torchtitan.parallel.distributed import exit_process\n"
        f"atexit.register(lambda: open({str(marker)!r}, 'w').write('yes'))\n"
        "sys.stdout.write('buffered line')\n"
        "exit_process(int(sys.argv[1]) if sys.argv[1] != 'none' else None)\n"
    )
    for arg, expected in (("3", 3), ("none", 0)):
        marker.unlink(missing_ok=True)
        r = subprocess.run([sys.executable, "-c", code, arg], cwd=ROOT, env=train_env(), capture_output=True,
                           text=True, timeout=120)  # fmt: skip
        assert r.returncode == expected and r.stdout == "buffered line" and marker.read_text() == "yes", (
            r.stderr
        )
