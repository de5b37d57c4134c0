"""The README as a new user meets it: its first-run walk, run as written on a fresh copy of the repository, and
run_train.sh's exit code when the run is preempted.

The walk's commands are read from README.md's code block under "## A first run, step by step", so the test fails
when README and code drift apart. Its only change to them: fewer training steps, through the override the README
itself names (the walk then takes ~1 min on a 2-core CPU instead of several).
"""

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, steps_in, train_env
from torchtitan.launch import exit_code_of
from torchtitan.metrics import read_tensorboard_scalars

WALK_HEADING = "## A first run, step by step"
QUICK = "--training.steps=3"  # the override the README gives for a quicker look (--training.steps=10)
STEPS = [
    "./run_train.sh",
    "tensorboard",
    "scripts/generate.py",
    "torchtitan.estimate",
    "scripts/plot_runs.py",
]


def walk_commands(readme: str) -> list[list[str]]:
    """The first indented code block after WALK_HEADING, one argv per command (continuation lines joined, comments
    dropped as a shell would)."""
    lines = readme.split(WALK_HEADING, 1)[1].splitlines()
    block, started = [], False
    for line in lines[1:]:
        if line.startswith("## "):
            break
        if line.startswith("    "):
            started = True
            block.append(line.strip())
        elif started and line.strip():
            break
    commands, pending = [], ""
    for line in block:
        pending += line
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        commands.append(shlex.split(pending, comments=True))
        pending = ""
    return commands


def fresh_copy(dest: Path) -> Path:
    """The repository's files as a clone has them (tracked, plus new files not yet committed; nothing ignored:
    no outputs/, no .venv)."""
    if (ROOT / ".git").exists():
        r = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
        for name in r.stdout.decode().split("\0"):
            src = ROOT / name
            if name and src.is_file():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / name)
    else:
        shutil.copytree(
            ROOT, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".venv", "outputs", ".*cache")
        )
    return dest


def user_env(repo: Path, bin_dir: Path) -> dict:
    """The user's shell after `source .venv/bin/activate`: `python` and `python3` are this interpreter (a tiny
    wrapper, so a system without a `python` command behaves the same), the repository is the one on sys.path."""
    bin_dir.mkdir()
    for name in ("python", "python3"):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        (bin_dir / name).chmod(0o755)
    env = train_env(PYTHONPATH=str(repo))
    env["PATH"] = f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    return env


def test_walk_parser_reads_continuations_and_comments():
    readme = f"intro\n{WALK_HEADING}\n\ntext\n\n    a --x 1   # note\n    b --y \\\n        'two words' # c\n\nmore\n"
    assert walk_commands(readme) == [["a", "--x", "1"], ["b", "--y", "two words"]]


@pytest.mark.slow
def test_readme_walk_runs_as_written(tmp_path):
    commands = walk_commands((ROOT / "README.md").read_text())
    firsts = [next((s for s in STEPS if s in argv[:3]), None) for argv in commands]
    assert firsts == STEPS, f"the README's walk changed: {commands}"
    repo = fresh_copy(tmp_path / "repo")
    env = user_env(repo, tmp_path / "bin")
    run_dir = repo / "outputs" / "debug_model"
    for step, argv in zip(STEPS, commands):
        if step == "tensorboard":  # a server: read its --logdir back with TensorBoard's own reader instead
            logdir = repo / argv[argv.index("--logdir") + 1]
            loss = read_tensorboard_scalars(logdir)["loss/global_avg"]
            assert [s for s, _ in loss] == [1, 3], loss  # the first step, the last one (log_freq 10)
            continue
        if step == "./run_train.sh":
            argv = [*argv, QUICK]
        r = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"{shlex.join(argv)}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        if step == "./run_train.sh":
            assert "training finished after 3 steps" in r.stdout + r.stderr
            assert (run_dir / "checkpoint" / "step-3").is_dir()  # the checkpoint the next command reads
        elif step == "scripts/generate.py":
            prompt = argv[argv.index("--prompt") + 1]
            text = r.stdout.strip().splitlines()[-1]
            assert text.startswith(prompt) and len(text) > len(prompt) + 10, r.stdout
        elif step == "torchtitan.estimate":
            est = json.loads((repo / argv[argv.index("--estimate.json") + 1]).read_text())
            assert est["fits"] is True and est["hardware"]["num_devices"] == 8
            assert est["tokens_per_sec_per_device"] > 0 and 0 < est["mfu_percent"] < 100
            assert est["memory_gib"] > 0 and est["step_time_s"] > 0
        elif step == "scripts/plot_runs.py":
            out = repo / argv[argv.index("--out") + 1]
            for name in ("loss", "throughput", "mfu"):
                assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_generate_after_a_run_without_checkpoints_names_the_flag(tmp_path):
    """The README's generate command after a plain `./run_train.sh` (no --checkpoint.enable=true): one line that
    says why there is nothing to load and which flag saves it."""
    from torchtitan.errors import UserError
    from torchtitan.generate.loader import find_checkpoint

    (tmp_path / "config.toml").write_text("")  # what every run writes into its dump folder
    with pytest.raises(UserError, match=r"saved no checkpoint .*--checkpoint\.enable=true"):
        find_checkpoint(str(tmp_path / "checkpoint"))
    with pytest.raises(UserError, match="does not exist or is not a folder"):  # anything else: as before
        find_checkpoint(str(tmp_path / "elsewhere" / "checkpoint"))


def test_launcher_exit_code_is_the_workers_common_one():
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    def failures(*codes):
        return {
            rank: ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=c, error_file="")
            for rank, c in enumerate(codes)
        }

    assert exit_code_of(failures(75, 75)) == 75
    assert exit_code_of(failures(2)) == 2
    assert exit_code_of(failures(-signal.SIGKILL, -signal.SIGKILL)) == 128 + signal.SIGKILL
    assert exit_code_of(failures(75, 1)) is None
    # torchrun SIGTERMs the rest once one worker has ended: a rank still leaving after the last barrier dies of it
    assert exit_code_of(failures(75, -signal.SIGTERM)) == 75
    assert exit_code_of(failures(-signal.SIGTERM, 2)) == 2
    assert exit_code_of(failures(-signal.SIGTERM, -signal.SIGTERM)) == 128 + signal.SIGTERM
    assert exit_code_of(failures(-signal.SIGKILL, 75)) is None  # a kill -9 is not explained away


@pytest.mark.slow
def test_run_train_sh_preempted_exits_75(tmp_path):
    """SIGTERM to run_train.sh (2 CPU processes under torchrun): the trainers save a checkpoint at the next check
    step and exit 75, and so does the script, without a traceback from torchrun."""
    args = [
        f"--job.dump_folder={tmp_path}",
        "--checkpoint.enable=true",
        "--training.steps=50",
        "--training.local_batch_size=2",
        "--training.seq_len=64",
        "--metrics.log_freq=1",
        "--metrics.peak_tflops=1",
    ]
    p = subprocess.Popen(
        ["./run_train.sh", *args],
        cwd=ROOT,
        env=train_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen = []
    for line in p.stdout:
        seen.append(line)
        if "INFO step      2 " in line:
            p.send_signal(signal.SIGTERM)
            break
    out = "".join(seen) + p.stdout.read()
    assert p.wait(timeout=300) == 75, out[-5000:]
    assert "exiting 75" in out and "the workers exited 75" in out
    assert "Traceback" not in out and "SignalException" not in out, out[-5000:]
    (saved,) = steps_in(tmp_path)  # one committed checkpoint, of the step the run stopped at
    assert 2 <= saved < 50 and f"checkpoint saved at step {saved}; exiting 75" in out
