"""comm.mode=fake_backend: one process simulates rank R of an N-rank job (torchtitan/simulate.py).

- the shard shapes a simulated rank builds equal those of a real 4-process gloo run of the same degrees;
- every parallel dimension (FSDP, HSDP, TP/SP/loss parallel, PP 1F1B / interleaved / zero-bubble V, CP through
  the test CPU kernel, gradient accumulation, AC modes, float8) runs as a simulated rank at world sizes 8 to 512,
  writes simulation.json with the issue's keys, and its parameter / gradient / AdamW bytes agree with the
  estimator's within 2 %;
- the estimator cross-check layouts (8B FSDP 64, 70B FSDP 32 x TP 8, 405B FSDP 8 x TP 8 x PP 8 1F1B and
  interleaved, HSDP, CP) at cut depth and vocabulary (full-size rows: scripts/simulate_check.py, docs/estimate.md);
- every file in train_configs/ runs as a simulated rank at the world size its header names;
- bad values and layouts fail with one line, exit 2, the same line a real launch prints.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from conftest import ROOT, import_script, run_script, train_env

pytestmark = pytest.mark.slow

KEYS = {
    "world_size", "rank", "device", "measured_gib", "estimated_gib", "step_time_s", "estimated_compute_s",
    "step_times_s", "estimated_step_s",
}  # fmt: skip
CATEGORIES = {"parameters", "gradients", "optimizer_states", "activations", "peak"}
STATES = ("parameters", "gradients", "optimizer_states")

DEBUG = [
    "--job.config_file=train_configs/debug_model.toml",
    "--job.print_config=false",
    "--metrics.enable_tensorboard=false",
    "--metrics.peak_tflops=1",  # no matmul calibration: these runs are about shapes and bytes
    "--training.seq_len=32",
    "--training.local_batch_size=2",
    "--training.steps=1",
    "--comm.mode=fake_backend",
]

# (world size, rank, layout): every parallel dimension, world sizes 8 to 512, ranks away from 0
LAYOUTS = {
    "fsdp8_selective_ac": (8, 3, ["--activation_checkpoint.mode=selective"]),
    "hsdp4x16_full_ac": (
        64,
        21,
        [
            "--parallelism.data_parallel_replicate_degree=4",
            "--parallelism.data_parallel_shard_degree=16",
            "--activation_checkpoint.mode=full",
        ],
    ),
    "replicate8": (
        8,
        5,
        ["--parallelism.data_parallel_replicate_degree=8", "--parallelism.data_parallel_shard_degree=1"],
    ),
    "fsdp32_tp4_sp_loss_parallel": (128, 77, ["--parallelism.tensor_parallel_degree=4"]),
    "fsdp4_tp4_no_sp": (
        16,
        6,
        [
            "--parallelism.tensor_parallel_degree=4",
            "--parallelism.enable_sequence_parallel=false",
            "--parallelism.enable_loss_parallel=false",
        ],
    ),
    "pp2_tp4_no_fsdp": (
        8,
        6,
        [
            "--parallelism.data_parallel_shard_degree=1",
            "--parallelism.tensor_parallel_degree=4",
            "--parallelism.pipeline_parallel_degree=2",
            "--parallelism.pipeline_parallel_microbatch_size=1",
        ],
    ),
    "pp8_fsdp8_tp4_1f1b": (
        256,
        170,
        [
            "--model.n_layers=8",
            "--parallelism.tensor_parallel_degree=4",
            "--parallelism.pipeline_parallel_degree=8",
            "--parallelism.pipeline_parallel_schedule=1F1B",
            "--training.local_batch_size=8",
            "--parallelism.pipeline_parallel_microbatch_size=1",
        ],
    ),
    "pp4x2_fsdp32_tp4_interleaved": (
        512,
        300,
        [
            "--model.n_layers=8",
            "--parallelism.tensor_parallel_degree=4",
            "--parallelism.pipeline_parallel_degree=4",
            "--parallelism.pipeline_parallel_schedule=Interleaved1F1B",
            "--parallelism.pipeline_parallel_stages_per_rank=2",
            "--training.local_batch_size=4",
            "--parallelism.pipeline_parallel_microbatch_size=1",
            "--activation_checkpoint.mode=full",
        ],
    ),
    "pp2_fsdp4_zbv": (
        8,
        1,
        [
            "--parallelism.pipeline_parallel_degree=2",
            "--parallelism.pipeline_parallel_schedule=ZBVZeroBubble",
            "--parallelism.pipeline_parallel_stages_per_rank=2",
            "--training.local_batch_size=4",
            "--parallelism.pipeline_parallel_microbatch_size=1",
            "--activation_checkpoint.mode=full",
        ],
    ),
    "fsdp16_grad_accum": (16, 9, ["--training.global_batch_size=64"]),
    "fsdp4_cp2": (8, 5, ["--parallelism.context_parallel_degree=2"]),
    "fsdp8_float8": (8, 2, ["--float8.enable=true", "--float8.min_dim=16"]),
}


def simulate_many(runs: list[list[str]], tmp_path, env=None) -> list[dict]:
    """Run the trainer's main() once per argument list in one process (tests/dist/train_many.py)."""
    spec = tmp_path / "runs.json"
    spec.write_text(json.dumps(runs))
    r = subprocess.run(
        [sys.executable, "tests/dist/train_many.py", str(spec)],
        cwd=ROOT,
        env=env or train_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULTS ")]
    assert line, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(line[0][len("RESULTS ") :])


def estimator_states(args: list[str], world: int, rank: int) -> dict[str, float]:
    return import_script("simulate_check").estimator_states(args, world, rank)


def check_result(dump, args, world, rank):
    result = json.loads((dump / "simulation.json").read_text())
    assert set(result) == KEYS
    assert (result["world_size"], result["rank"], result["device"]) == (world, rank, "cpu")
    assert CATEGORIES <= set(result["measured_gib"]) and CATEGORIES <= set(result["estimated_gib"])
    assert result["step_time_s"] > 0 and result["estimated_compute_s"] > 0
    assert result["step_time_s"] == min(result["step_times_s"][1:] or result["step_times_s"])
    parts = result["estimated_step_s"]
    assert set(parts) == {"compute", "optimizer", "no_communication", "full"}
    assert parts["no_communication"] == result["estimated_compute_s"]
    assert parts["no_communication"] == pytest.approx(parts["compute"] + parts["optimizer"])
    assert parts["no_communication"] > parts["compute"] > 0
    # None where the CPU's missing interconnect rates would price the N-rank step's communication
    assert parts["full"] is None or parts["full"] >= parts["no_communication"]
    est = estimator_states(args, world, rank)
    for k in STATES:
        assert result["measured_gib"][k] == pytest.approx(est[k], rel=0.02), (k, result["measured_gib"], est)
    check_tensor_peak(result["measured_gib"])
    return result


def check_tensor_peak(measured: dict) -> None:
    """A CPU rank that counted its first step's tensors (torch's MemTracker; not when compiled): their
    peak holds at least the states counted after the step and fits in the process's resident peak, and the
    activations are that peak less the states; a rank that did not count them reports no activations."""
    if "max_allocated" not in measured:
        assert measured["activations"] is None, measured
        return
    states = sum(measured[k] for k in STATES)
    assert states < measured["max_allocated"] < measured["peak"], measured
    assert measured["activations"] == pytest.approx(measured["max_allocated"] - states), measured


@pytest.fixture(scope="module")
def layout_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("layouts")
    runs = {}
    for name, (world, rank, layout) in LAYOUTS.items():
        args = [*DEBUG, *layout, f"--comm.fake_world_size={world}", f"--comm.fake_rank={rank}"]
        runs[name] = [*args, f"--job.dump_folder={tmp / name}"]
    results = simulate_many(list(runs.values()), tmp)
    return tmp, runs, dict(zip(runs, results))


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_dimension_runs_as_a_simulated_rank(layout_runs, name):
    tmp, runs, results = layout_runs
    assert results[name]["rc"] == 0, results[name]["stderr"]
    world, rank, layout = LAYOUTS[name]
    result = check_result(tmp / name, runs[name], world, rank)
    # the tensors are counted on every eager layout: pipeline micro-batches, gradient accumulation and the
    # zero-bubble schedule's split backward included (simulate._step_tracker runs MemTracker without module hooks)
    assert "max_allocated" in result["measured_gib"], result["measured_gib"]
    log = (tmp / name / "logs" / f"rank{rank}.log").read_text()
    assert (
        f"simulated rank {rank} of {world} (fake process groups: no communication, loss values meaningless)"
        in log
    )
    # a zero-bubble schedule under whole-block checkpointing is warned about (its weight pass recomputes per group)
    warned = "ZBVZeroBubble under activation checkpointing: torch's weight pass recomputes" in log
    assert warned == (name == "pp2_fsdp4_zbv"), log[-2000:]


def test_shard_shapes_equal_a_real_gloo_run(tmp_path):
    real, fake = tmp_path / "real", tmp_path / "fake"
    real.mkdir()
    fake.mkdir()
    r = run_script(4, "tests/dist/shard_shapes.py", [str(real)])
    assert r.returncode == 0
    r = subprocess.run(
        [sys.executable, "tests/dist/shard_shapes.py", str(fake), "--fake", "4"],
        cwd=ROOT,
        env=train_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    files = sorted(p.name for p in real.glob("*.json"))
    assert len(files) == 12  # 3 layouts x 4 ranks
    for name in files:
        assert json.loads((fake / name).read_text()) == json.loads((real / name).read_text()), name


# ---- the estimator cross-check layouts, cut to 2 layers (PP: one per stage) and a 32768-token vocabulary ------
# 405B's own width does not fit CI: one 405B block is 400M parameters per TP rank, and a pipeline stage keeps it
# gathered in bf16 with unsharded fp32 gradients (measured: 11.9 GB resident for one block + embedding). Its
# rows here keep the flavor's heads, layout and schedule at width 2048; full-width ranks are the benchmark rows
# of docs/estimate.md (scripts/simulate_check.py).
NARROW_405B = ["--model.dim=2048", "--model.ffn_hidden_dim=8192"]
CROSS = [
    "8b_fsdp64",
    "70b_fsdp32_tp8",
    "405b_fsdp8_tp8_pp8_1f1b",
    "405b_fsdp8_tp8_pp8_interleaved",
    "8b_hsdp8x8",
    "8b_fsdp32_cp2",
]


@pytest.mark.parametrize("row", CROSS)
def test_estimator_and_simulated_rank_agree_on_states(row):
    # one process per row, as scripts/simulate_check.py runs them (its own peak; fresh process groups)
    check = import_script("simulate_check")
    extra = ["--metrics.peak_tflops=1", *(NARROW_405B if row.startswith("405b") else [])]
    result = check.run_row(row, seq=16, steps=1, n_layers=2, vocab=32768, extra=extra, env=train_env())
    world, rank, _ = check.ROWS[row]
    assert (result["world_size"], result["rank"]) == (world, rank)
    assert set(result) == KEYS | {"estimated_states_gib", "wall_s", "row"}
    assert CATEGORIES <= set(result["measured_gib"]) and CATEGORIES <= set(result["estimated_gib"])
    for k, err in check.states_error(result).items():
        assert abs(err) <= 0.02, (row, k, result["measured_gib"], result["estimated_states_gib"])
    check_tensor_peak(result["measured_gib"])


def test_a_pipeline_first_stage_accumulates_the_tp_embeddings_gradient_as_its_whole_table(tmp_path):
    """PP's micro-batches under FSDP: the stage's gradients accumulate unsharded, in fp32, until the last one is
    reduce-scattered, and the TP-split embedding's is DTensor's Partial gradient, the whole table on every TP rank
    (with each micro-batch's bf16 table beside it while it is added). The debug model with a 131,072-token
    vocabulary, so that the embedding is the first stage's peak: the rank's counted tensor peak is the estimate's
    (which counted the accumulator at the rank's rows only before: 0.18 GiB against 0.26 measured)."""
    args = [*DEBUG, "--model.vocab_size=131072", "--training.local_batch_size=4",
            "--parallelism.tensor_parallel_degree=4", "--parallelism.pipeline_parallel_degree=2",
            "--parallelism.pipeline_parallel_microbatch_size=1", "--comm.fake_world_size=16",
            "--comm.fake_rank=1", f"--job.dump_folder={tmp_path / 'run'}"]  # fmt: skip
    [result] = simulate_many([args], tmp_path)
    assert result["rc"] == 0, result["stderr"]
    out = check_result(tmp_path / "run", args, 16, 1)
    measured, estimated = out["measured_gib"], out["estimated_gib"]
    table = 131072 * 256 * 4 / 2**30  # the fp32 Partial accumulator of the whole table
    assert measured["max_allocated"] > table + table / 2  # and a micro-batch's bf16 table
    assert measured["max_allocated"] == pytest.approx(estimated["peak"], rel=0.05), (measured, estimated)


# ---- the shipped configs at the world size each was written for (header comment "Written for N GPUs") ------
CONFIGS = sorted(p.name for p in (ROOT / "train_configs").glob("*.toml"))


def written_world(name: str) -> int:
    m = re.search(r"Written for (\d+) (?:GPUs|process)", (ROOT / "train_configs" / name).read_text())
    assert m, f"train_configs/{name}: no 'Written for N GPUs' line in its header"
    return int(m.group(1))


def test_every_shipped_config_runs_as_a_simulated_rank(tmp_path):
    runs = {}
    for name in CONFIGS:
        world = written_world(name)
        args = [
            f"--job.config_file=train_configs/{name}",
            f"--job.dump_folder={tmp_path / name}",
            "--job.print_config=false",
            "--metrics.enable_tensorboard=false",
            "--metrics.peak_tflops=1",
            "--training.seq_len=16",
            "--training.steps=1",
            "--comm.mode=fake_backend",
            f"--comm.fake_world_size={world}",
            f"--comm.fake_rank={world - 1}",
        ]
        # memory of this CI machine: 2 layers (PP: one per stage), a 32K vocabulary, 405B narrowed (above)
        if name != "debug_model.toml":
            args += [
                "--model.n_layers=8" if "405b" in name else "--model.n_layers=2",
                "--model.vocab_size=32768",
            ]
        if "405b" in name:
            args += NARROW_405B
        runs[name] = args
    results = simulate_many(list(runs.values()), tmp_path)
    for name, result in zip(runs, results):
        assert result["rc"] == 0, (name, result["stderr"])
        world = written_world(name)
        check_result(tmp_path / name, runs[name], world, world - 1)


# ---- errors: one line, exit 2, before anything is allocated ---------------------------------------------------


def one_line_error(result: dict) -> str:
    assert result["rc"] == 2, result
    lines = result["stderr"].strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_bad_values_fail_with_one_line_naming_the_key(tmp_path):
    base = [*DEBUG, f"--job.dump_folder={tmp_path / 'out'}"]
    cases = {
        "comm.fake_rank": [*base, "--comm.fake_world_size=8", "--comm.fake_rank=8"],
        "comm.fake_world_size": [*base, "--comm.fake_world_size=0"],
        "comm.fake_world_size = 12": [
            *base,
            "--comm.fake_world_size=12",
            "--parallelism.tensor_parallel_degree=8",
        ],
        "checkpoint.enable": [*base, "--comm.fake_world_size=8", "--checkpoint.enable=true"],
        "validation.enable": [*base, "--comm.fake_world_size=8", "--validation.enable=true"],
    }
    results = simulate_many(list(cases.values()), tmp_path)
    for key, result in zip(cases, results):
        assert key in one_line_error(result)
    assert not (tmp_path / "out" / "simulation.json").exists()


def test_a_layout_that_fails_a_real_launch_fails_the_same_way(tmp_path):
    # 6 layers cannot fill 8 pipeline stages; heads 16 / kv heads 4 cannot split over TP 8; a zero-bubble schedule's
    # weight pass under per-op selective checkpointing (which crashed at the first weight pass before it was checked)
    zbv_op_ac = [
        *LAYOUTS["pp2_fsdp4_zbv"][2],
        "--activation_checkpoint.mode=selective",
    ]  # the later flag wins
    layouts = [
        ["--parallelism.pipeline_parallel_degree=8"],
        ["--parallelism.tensor_parallel_degree=8"],
        zbv_op_ac,
    ]
    common = [*DEBUG[:-1], f"--job.dump_folder={tmp_path / 'out'}"]
    fake = simulate_many(
        [[*common, *lay, "--comm.mode=fake_backend", "--comm.fake_world_size=64"] for lay in layouts],
        tmp_path,
    )
    # the real launch: rank 0 of a 64-process torchrun world (it fails before joining the others)
    env = train_env(
        WORLD_SIZE="64",
        RANK="0",
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="8",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT="1",
    )
    real = simulate_many([[*common, *lay] for lay in layouts], tmp_path, env=env)
    for f, r in zip(fake, real):
        assert one_line_error(f) == one_line_error(r)
    assert "selective_ac_option='op' refuses" in one_line_error(fake[2])
    # and fake mode under a launcher with WORLD_SIZE > 1 is refused
    (under_torchrun,) = simulate_many([[*DEBUG, "--comm.fake_world_size=8"]], tmp_path, env=env)
    assert "WORLD_SIZE=64" in one_line_error(under_torchrun)


def test_dry_run_checks_the_simulated_world(tmp_path):
    r = subprocess.run(
        [sys.executable, "train.py", *DEBUG, "--comm.fake_world_size=64", "--parallelism.tensor_parallel_degree=4",
         f"--job.dump_folder={tmp_path}", "--job.dry_run=true"],
        cwd=ROOT, env=train_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "world 64 = pp 1 x dp_replicate 1 x dp_shard 16 x cp 1 x tp 4" in r.stdout


def test_preflight_applies_the_simulations_checks(tmp_path):
    """python -m torchtitan.preflight under comm.mode=fake_backend checks the simulated world with the same
    one-line errors as the run and its dry run (a rank outside the world passed the preflight before)."""
    r = subprocess.run(
        [sys.executable, "-m", "torchtitan.preflight", *DEBUG, "--comm.fake_world_size=8", "--comm.fake_rank=8",
         f"--job.dump_folder={tmp_path}"],
        cwd=ROOT, env=train_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2 and "comm.fake_rank = 8" in r.stderr, r.stdout + r.stderr
