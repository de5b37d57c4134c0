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
from pathlib import Path

import pytest

from conftest import FIXED_PEAK, ROOT, shared_run, train_together

sys.path.insert(0, str(ROOT / "scripts"))
from loss_compare import PARITY_DEFAULTS, compare  # noqa: E402

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
    # compiled blocks under TP (the embedding's async output materialized for them: parallel/tensor.py) and the
    # default compile components: the loss stays eager under loss parallel (parallel/compile.compiles_loss)
    "tp2_compile": (
        2,
        ["--training.local_batch_size=4", "--parallelism.tensor_parallel_degree=2", "--compile.enable=true"],
    ),
}


# The gradient accumulation tests' runs (name: (processes, arguments)), trained with the layouts (parity_runs): one
# step of 4 sequences against 4 micro-steps of 1, in one process and under FSDP 2 (data.num_shards=2: the same 4
# windows per step).
ACCUMULATION = {
    "one_step": (1, [*COMMON, "--training.local_batch_size=4"]),
    "micro_steps": (1, [*COMMON, "--training.local_batch_size=1", "--training.global_batch_size=4"]),
    "fsdp_one_step": (1, [*COMMON, "--data.num_shards=2", "--training.local_batch_size=4"]),
    "fsdp_micro_steps": (
        2,
        [*COMMON, "--data.num_shards=2", "--training.local_batch_size=1", "--training.global_batch_size=4"],
    ),
}


def _parity_out(tmp_path_factory, worker_id) -> tuple[Path, dict[str, tuple[int, list[str]]]]:
    """The folder of parity_runs's runs (trained once per session: conftest.shared_run) and the runs themselves."""
    import test_parity_cp
    import test_parity_pp

    runs = {
        "parity-single": (1, [*SHARDED, "--training.local_batch_size=4"]),
        "pp-baseline": (1, [*test_parity_pp.COMMON, "--training.local_batch_size=4"]),
    }
    runs.update({f"parity-{name}": run for name, run in ACCUMULATION.items()})
    runs.update({f"cp-{name}": run for name, run in test_parity_cp.RESUME.items()})
    for prefix, layouts, common in (
        ("parity", LAYOUTS, SHARDED),
        ("cp", test_parity_cp.LAYOUTS, SHARDED),
        ("pp", test_parity_pp.LAYOUTS, test_parity_pp.COMMON),
    ):
        runs.update({f"{prefix}-{name}": (n, [*common, *args]) for name, (n, args) in layouts.items()})

    def build(out):
        (out / "rows.json").write_text(json.dumps(layout_rows(runs, out, common=[])))

    return shared_run(tmp_path_factory, worker_id, "parity_runs", build), runs


def parity_runs(tmp_path_factory, worker_id) -> dict[str, list[dict]]:
    """The metrics.jsonl rows of every run that this file, tests/test_parity_cp.py and tests/test_parity_pp.py compare
    with each other, trained once per session (conftest.shared_run) and keyed "<file>-<name>": this file's LAYOUTS
    and ACCUMULATION ("parity-..."), test_parity_cp.LAYOUTS and RESUME ("cp-..."), test_parity_pp.LAYOUTS ("pp-..."),
    and the two 1-process references, "parity-single" (this file's and test_parity_cp.py's) and "pp-baseline". The
    runs of one world size train in one torchrun (layout_rows), so the three files start one process, one 2-rank and
    one 4-rank torchrun between them instead of four, four and three; each run gets exactly the arguments its test
    gave it alone (loss_compare.run's defaults first)."""
    out, _ = _parity_out(tmp_path_factory, worker_id)
    return json.loads((out / "rows.json").read_text())


def parity_folder(tmp_path_factory, worker_id, name: str) -> Path:
    """The dump folder of parity_runs's run `name` (shared: copy it before changing it)."""
    out, runs = _parity_out(tmp_path_factory, worker_id)
    return out / f"{runs[name][0]}_ranks" / name


def single_rows(tmp_path_factory, worker_id) -> list[dict]:
    """The 1-process reference run (metrics.jsonl rows), made once per session for this file and
    tests/test_parity_cp.py, which compare with the same run."""
    return parity_runs(tmp_path_factory, worker_id)["parity-single"]


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
def layouts(tmp_path_factory, worker_id):
    rows = parity_runs(tmp_path_factory, worker_id)
    return {name: rows[f"parity-{name}"] for name in LAYOUTS}


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


def test_gradient_accumulation_equals_one_large_batch(tmp_path_factory, worker_id):
    """4 micro-steps of 1 sequence == one step of 4 sequences (same 4 windows, in the same order)."""
    rows = parity_runs(tmp_path_factory, worker_id)  # both in one process
    lines, worst = compare(rows["parity-one_step"], rows["parity-micro_steps"], RTOL)
    check("\n".join(lines), worst)


def test_gradient_accumulation_with_fsdp_sums_over_ranks_and_micro_steps(tmp_path_factory, worker_id):
    """FSDP 2 x 2 micro-steps of 1 sequence == 1 process, one step of 4 (the same 4 windows per step)."""
    rows = parity_runs(tmp_path_factory, worker_id)
    lines, worst = compare(rows["parity-fsdp_one_step"], rows["parity-fsdp_micro_steps"], RTOL)
    check("\n".join(lines), worst)
    assert all(v <= RTOL for v in worst.values())  # loss_compare()'s verdict, as before
