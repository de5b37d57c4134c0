"""Loss parity: every parallel layout trains like the single-process run (CPU, gloo, fp32, 10 steps).

Each layout sees the same global batch of 4 sequences x 64 tokens per step (data.num_shards=4 makes the global
batch independent of the data-parallel degree) and must match the 1-process run in loss AND grad norm.

Tolerance: RTOL = 1e-5 relative, per step. With fp32 parameters and fp32 gradient reduction the layouts differ
only in the order of floating-point sums (sharded matmuls, reduce-scatters, the vocab-parallel softmax), each
step contributing errors of order fp32 epsilon (1.2e-7); measured worst over 10 steps: 1.4e-7 for the loss and
4.0e-7 for the grad norm (table in docs/parallelism.md). The bugs this guards against are orders of magnitude larger: a
gradient averaged instead of summed (or normalized per micro-step) changes the grad norm by a factor of dp or of
the accumulation count, a norm that misses or double-counts a mesh's shards by 1e-3 or more, a wrong TP/SP
layout changes the loss at the first step. 1e-5 leaves 25x headroom over the noise.
"""

from __future__ import annotations

import json
import sys

import pytest

from conftest import FIXED_PEAK, ROOT, shared_run, train_together

sys.path.insert(0, str(ROOT / "scripts"))
from loss_compare import PARITY_DEFAULTS, compare, loss_compare, run  # noqa: E402

RTOL = 1e-5
STEPS = 10
COMMON = [
    "--job.config_file=train_configs/debug_model.toml",
    f"--training.steps={STEPS}",
    "--training.seq_len=64",
    "--metrics.enable_jsonl=true",
    FIXED_PEAK,  # loss and grad norm only: no MFU, no calibration
]
SHARDED = [*COMMON, "--data.num_shards=4"]  # global batch: 4 sequences, one from each virtual shard

LAYOUTS = {
    "fsdp4": (4, ["--training.local_batch_size=1"]),
    # the two non-default reshard policies ride along on HSDP and FSDP x TP
    "hsdp2x2": (
        4,
        [
            "--training.local_batch_size=1",
            "--parallelism.data_parallel_replicate_degree=2",
            "--parallelism.fsdp_reshard_after_forward=always",
        ],
    ),
    "fsdp2_tp2": (
        4,
        [
            "--training.local_batch_size=2",
            "--parallelism.tensor_parallel_degree=2",
            "--parallelism.fsdp_reshard_after_forward=never",
        ],
    ),
    "tp4_sp_lp": (4, ["--training.local_batch_size=4", "--parallelism.tensor_parallel_degree=4"]),
}


def single_rows(tmp_path_factory, worker_id) -> list[dict]:
    """The 1-process reference run (metrics.jsonl rows), made once per session for this file and
    tests/test_parity_cp.py, which compare with the same run."""

    def build(out):
        run(1, [*SHARDED, "--training.local_batch_size=4"], str(out))

    out = shared_run(tmp_path_factory, worker_id, "parity_single", build)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def single(tmp_path_factory, worker_id):
    return single_rows(tmp_path_factory, worker_id)


def layout_rows(layouts: dict[str, tuple[int, list[str]]], root, common=SHARDED) -> dict[str, list[dict]]:
    """Every layout (name: (processes, arguments)) trained as loss_compare.run trains it, after `common`; all layouts
    of one world size in one torchrun (conftest.train_together). The metrics.jsonl rows by layout."""
    rows = {}
    for nproc in sorted({n for n, _ in layouts.values()}):
        runs = {name: [*PARITY_DEFAULTS, *common, *a] for name, (n, a) in layouts.items() if n == nproc}
        for name, folder in train_together(nproc, runs, root / f"{nproc}_ranks").items():
            rows[name] = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return rows


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    return layout_rows(LAYOUTS, tmp_path_factory.mktemp("layouts"))


def check(report: str, worst: dict):
    print(report)
    print("worst:", {k: f"{v:.2e}" for k, v in worst.items()})
    assert sum(line.split()[0].isdigit() for line in report.splitlines() if line.strip()) == STEPS
    for key, value in worst.items():
        assert value <= RTOL, f"{key} differs by {value:.2e} > {RTOL:g}\n{report}"


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_matches_single_process(layout, single, layouts):
    lines, worst = compare(single, layouts[layout], RTOL)
    check("\n".join(lines), worst)
    assert single[0]["loss/global_avg"] > 5 and single[-1]["loss/global_avg"] < single[0]["loss/global_avg"]


def test_gradient_accumulation_equals_one_large_batch(tmp_path):
    """4 micro-steps of 1 sequence == one step of 4 sequences (same 4 windows, in the same order)."""
    runs = {
        "one_step": (1, ["--training.local_batch_size=4"]),
        "micro_steps": (1, ["--training.local_batch_size=1", "--training.global_batch_size=4"]),
    }
    trained = layout_rows(runs, tmp_path, COMMON)  # both in one process
    lines, worst = compare(trained["one_step"], trained["micro_steps"], RTOL)
    check("\n".join(lines), worst)


def test_gradient_accumulation_with_fsdp_sums_over_ranks_and_micro_steps():
    """FSDP 2 x 2 micro-steps of 1 sequence == 1 process, one step of 4 (the same 4 windows per step)."""
    ok, report, worst = loss_compare(
        ["--training.local_batch_size=4"],
        ["--training.local_batch_size=1", "--training.global_batch_size=4"],
        nproc_b=2,
        common=[*COMMON, "--data.num_shards=2"],
        rtol=RTOL,
    )
    check(report, worst)
    assert ok
