"""Goodput: every second since the job first started in exactly one part, across restarts.

Unit tests drive the tracker with a fake clock (exact sums); the end-to-end test runs the trainer with a
checkpoint save and validation, kills it (kill -9) after step 5, restarts it, and reads the counters back with
TensorBoard's reader: they add up to the wall time within 2 %, continue across the restart, and the two steps
re-done after the restart (4 and 5: the checkpoint is at step 3) are counted as lost. The same run checks that
every tag the trainer writes is documented in docs/metrics.md and no step appears twice after the resume, in
TensorBoard and in the offline W&B run (whose resumed part rewinds to the checkpoint's step).
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest

from conftest import ROOT, TINY, run_train, train_env
from torchtitan.metrics import goodput as gp
from torchtitan.metrics import read_tensorboard_scalars
from torchtitan.metrics.processor import goodput_metrics

# ---------------------------------------------------------------------------------------------- fake clock


class Clock:
    def __init__(self):
        self.t = 100.0

    def perf_counter(self):
        return self.t

    def time(self):
        return 1_000_000.0 + self.t  # unix time, offset from perf_counter by a constant

    def advance(self, seconds):
        self.t += seconds


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(gp, "time", c)
    monkeypatch.setattr(gp, "process_start_unix", lambda: c.process_start)
    return c


def tracker(clock, path=None, started_ago=5.0):
    """A tracker whose process started `started_ago` seconds before now."""
    clock.process_start = clock.time() - started_ago
    return gp.GoodputTracker(str(path) if path else None, rank=0)


_real_process_start = gp.process_start_unix


def parts_sum(snap):
    return sum(snap["parts"].values())


def test_parts_add_up_and_steps_are_categorized(clock):
    g = tracker(clock)  # process started 5 s ago: the imports count as init
    clock.advance(2)
    with g.phase("checkpoint_load"):
        clock.advance(1)
    clock.advance(1)
    g.start_training(0)
    clock.advance(3)
    g.step_done(1, data_s=0.5)  # first step of the process: warm-up
    clock.advance(1)
    with g.phase("validation"):
        clock.advance(2)
    clock.advance(1)
    g.step_done(2, data_s=0.25)
    with g.phase("checkpoint_save"):
        clock.advance(0.5)
    clock.advance(0.75)  # step 3 in progress: counted as productive in a snapshot
    snap = g.snapshot()
    assert snap["parts"] == {
        "init": 8.0,
        "checkpoint_load": 1.0,
        "warmup": 2.5,
        "productive": 1.75 + 0.75,
        "data": 0.75,
        "lost": 0.0,
        "checkpoint_save": 0.5,
        "validation": 2.0,
        "restart": 0.0,
    }
    assert parts_sum(snap) == pytest.approx(snap["wall_s"]) and snap["wall_s"] == pytest.approx(17.25)
    m = goodput_metrics(snap)
    assert m["goodput/percent"] == pytest.approx(100 * 2.5 / 17.25)
    assert g.phase_seconds == 3.5  # what the step timer leaves out
    # a snapshot taken inside a phase counts the phase so far, once
    with g.phase("validation"):
        clock.advance(1)
        inside = g.snapshot()
    assert inside["parts"]["validation"] == 3.0 and parts_sum(inside) == pytest.approx(inside["wall_s"])


def test_restart_continues_counters_counts_lost_steps_and_the_gap(clock, tmp_path):
    path = tmp_path / "goodput.json"
    first = tracker(clock, path)
    first.start_training(0)
    ckpt_state = None
    for step in range(1, 6):
        clock.advance(1)
        first.step_done(step, 0.0)
        if step == 3:
            ckpt_state = json.loads(json.dumps(first.state_dict()))  # what the checkpoint's train_state keeps
        first.save_progress()  # log steps
    job_start = first.job_start_unix
    clock.advance(0.5)  # the unrecorded tail of the crashed process
    clock.advance(10)  # the scheduler's restart delay
    second = tracker(clock, path, started_ago=2.0)
    clock.advance(2)
    second.load_state_dict(ckpt_state)  # resumed from the step-3 checkpoint
    second.start_training(3)
    for step in (4, 5, 6):
        clock.advance(1)
        second.step_done(step, 0.0)
    snap = second.snapshot()
    assert snap["job_start_unix"] == job_start and snap["restarts"] == 1
    assert snap["lost_steps"] == 2 and snap["parts"]["lost"] == 2.0  # steps 4 and 5 re-done
    # from the last record (after step 5) to this process's start, 2 s before the tracker was made
    assert snap["parts"]["restart"] == pytest.approx(8.5)
    assert snap["parts"]["productive"] == 4.0 + 1.0  # steps 2-5 of the first process, step 6 of the second
    assert snap["parts"]["warmup"] == 1.0  # step 1; the second process's first step was a re-done one
    assert snap["parts"]["init"] == pytest.approx(5.0 + 4.0)
    assert parts_sum(snap) == pytest.approx(snap["wall_s"])


def test_checkpoint_state_is_the_fallback_and_a_finished_job_is_not_continued(clock, tmp_path):
    path = tmp_path / "goodput.json"
    first = tracker(clock, path)
    first.start_training(0)
    clock.advance(4)
    first.step_done(1, 0.0)
    state = first.state_dict()
    # no progress file (e.g. the checkpoint was copied elsewhere): the checkpoint's copy continues the job
    clock.advance(3)
    second = tracker(clock, None, started_ago=1.0)
    second.load_state_dict(state)
    second.start_training(1)
    snap = second.snapshot()
    assert snap["job_start_unix"] == first.job_start_unix and snap["restarts"] == 1
    assert snap["parts"]["restart"] == pytest.approx(2.0)
    assert parts_sum(snap) == pytest.approx(snap["wall_s"])
    # a job that finished, then a run from step 0 in the same folder: a new job
    first.save_progress(finished=True)
    clock.advance(100)
    third = tracker(clock, path)
    third.start_training(0)
    assert third.snapshot()["restarts"] == 0 and third.job_start_unix > first.job_start_unix


def test_process_start_is_before_now():
    import time

    start = _real_process_start()
    assert 0 <= time.time() - start < 3600  # this pytest process started less than an hour ago


# ------------------------------------------------------------------------------- end to end, with a restart

ARGS = TINY + [
    "--training.steps=6",
    "--training.mixed_precision_param=float32",
    "--lr_scheduler.warmup_steps=2",
    "--metrics.peak_tflops=1",
    "--checkpoint.enable=true",
    "--checkpoint.interval=3",
    "--validation.enable=true",
    "--validation.freq=2",
    "--validation.steps=2",
    "--metrics.enable_wandb=true",
]
# Tags written only on CUDA, only with float8, or only with a known FP8 peak.
CONDITIONAL = {
    "memory/max_active_gib",
    "memory/max_active_pct",
    "memory/max_reserved_gib",
    "memory/max_reserved_pct",
    "memory/alloc_retries",
    "memory/ooms",
    "mfu/percent_fp8_mixed",
}


def documented_tags() -> set[str]:
    """Every tag in the first column of docs/metrics.md's tables (`a`, `b` lists several), up to the inference
    benchmark's section, whose fields go to its JSON, not to the training sinks."""
    tags = set()
    for line in (ROOT / "docs" / "metrics.md").read_text().splitlines():
        if line.startswith("## Inference benchmark"):
            break
        if line.startswith("| `"):
            first = line.split("|")[1]
            tags.update(re.findall(r"`([a-z0-9_/]+)`", first))
    return tags


@pytest.fixture(scope="module")
def restarted(tmp_path_factory):
    out = tmp_path_factory.mktemp("restart")
    env = train_env(WANDB_MODE="offline", TORCHTITAN_TEST_FAULT="step_end:5")
    first = run_train(1, [*ARGS, f"--job.dump_folder={out}"], env=env)
    assert first.returncode == -9  # killed after step 5 (the last checkpoint is step 3)
    second = run_train(1, [*ARGS, f"--job.dump_folder={out}"], env=train_env(WANDB_MODE="offline"))
    assert second.returncode == 0, second.stderr[-3000:]
    return out, second


def test_goodput_adds_up_and_survives_the_restart(restarted):
    out, second = restarted
    tb = read_tensorboard_scalars(out / "tb")
    last = {tag: points[-1][1] for tag, points in tb.items() if tag.startswith("goodput/")}
    wall = last["goodput/wall_s"]
    parts = sum(last[f"goodput/{p}_s"] for p in gp.PARTS)
    assert abs(parts - wall) <= 0.02 * wall, (parts, wall, last)
    assert last["goodput/restarts"] == 1 and last["goodput/lost_steps"] == 2
    assert last["goodput/lost_s"] > 0 and last["goodput/restart_s"] > 0
    assert last["goodput/checkpoint_save_s"] > 0 and last["goodput/checkpoint_load_s"] > 0
    assert last["goodput/validation_s"] > 0 and last["goodput/productive_s"] > 0
    assert last["goodput/init_s"] > 0 and last["goodput/warmup_s"] > 0
    assert 0 < last["goodput/percent"] < 100
    # the counters continued: the first process's init and warm-up are still in the total
    first_wall = dict(tb["goodput/wall_s"])[3]  # logged by the first process, kept (steps < the resume point)
    assert wall > first_wall
    progress = json.loads((out / "goodput.json").read_text())
    assert progress["finished"] and progress["furthest_step"] == 6 and progress["lost_steps"] == 2
    assert "goodput " in second.stdout  # its own console line


def test_every_tag_documented_and_no_step_twice_after_resume(restarted):
    out, _ = restarted
    tb = read_tensorboard_scalars(out / "tb")
    documented = documented_tags()
    assert set(tb) <= documented, f"undocumented tags: {sorted(set(tb) - documented)}"
    assert documented - CONDITIONAL <= set(tb), f"documented but not written: {sorted(documented - set(tb))}"
    for tag, points in tb.items():
        steps = [s for s, _ in points]
        assert len(steps) == len(set(steps)), (tag, steps)
    assert [s for s, _ in tb["loss/global_avg"]] == [1, 2, 3, 4, 5, 6]
    assert [s for s, _ in tb["validation/loss"]] == [2, 4, 6]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]


# -------------------------------------------------------------------- W&B offline runs, read back from disk


def wandb_records(path: Path):
    """The records of an offline W&B run file (LevelDB-style log: 7-byte file header, 32 KiB blocks, records
    of [crc32 u32][length u16][type u8] + data, type 1 whole, 2/3/4 first/middle/last piece)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, piece = 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:  # zero padding to the block end
            pos += left
            continue
        piece += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(piece)
            piece = b""
            yield record


def wandb_history(run_file: Path) -> tuple[dict, dict[int, dict]]:
    """(the run record's config update as a dict, {step: {tag: value}})."""
    config, history = {}, {}
    for r in wandb_records(run_file):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            config = {item.key: json.loads(item.value_json) for item in r.run.config.update}
        elif kind == "history":
            values = {
                (item.key or "/".join(item.nested_key)): json.loads(item.value_json)
                for item in r.history.item
            }
            history.setdefault(r.history.step.num, {}).update(values)
    return config, history


def test_wandb_offline_continues_the_run_after_resume(restarted):
    out, _ = restarted
    run_id = (out / "wandb" / "run_id").read_text().strip()
    runs = sorted((out / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(runs) == 2, runs  # the killed process and the resumed one, one W&B run id
    # (the killed process's file holds only its header: W&B's own service writes the offline file in batches,
    # and a SIGKILL loses what it had not written; TensorBoard and JSONL flush every log step)
    config, after = wandb_history(runs[1])
    assert config["_wandb"]["branch_point"] == {"run_id": run_id, "step": 3}  # rewound to the checkpoint
    assert sorted(after) == [4, 5, 6]  # then each step once
    tb = dict(read_tensorboard_scalars(out / "tb")["loss/global_avg"])
    for step, values in after.items():
        assert values["loss/global_avg"] == pytest.approx(tb[step], rel=1e-6)
        assert "goodput/percent" in values and "stragglers/factor" in values
    assert "validation/loss" in after[4] and "validation/loss" in after[6]
