"""Loss parity for pipeline parallelism: every schedule, alone and with FSDP, trains like one process.

fp32 parameters and reductions (scripts/loss_compare.py's defaults), 10 steps of the debug model at seq_len 64.
The baseline is 1 process with a local batch of 4; data.num_shards=2 gives every layout the same global batch,
so the dp 2 layouts (PP 2 x FSDP 2) read exactly the rows the single process reads.

Tolerance: 1e-5 relative on loss and grad norm. With fp32 the only difference left is the order of
floating-point sums (micro-batch gradients accumulated one by one instead of one batched matmul, FSDP's
reduce-scatter, the pp all-reduce of squared norms); measured worst over 10 steps: 1.8e-7 (loss) and 1.2e-7
(grad norm, accumulated in fp64 by clip_grad_norm_). A real bug (a dropped micro-batch, a stage missing from the
norm, a wrong 1/n scaling, lost weight gradients) moves step 1 or 2 by more than 1e-3.
"""

import sys

import pytest
import torch
from test_parity import parity_runs

from conftest import FIXED_PEAK, ROOT, TINY, run_script, train_env

sys.path.insert(0, str(ROOT / "scripts"))
from loss_compare import compare  # noqa: E402

RTOL = 1e-5
COMMON = [*TINY, FIXED_PEAK, "--training.steps=10", "--data.num_shards=2", "--lr_scheduler.warmup_steps=2"]


def pp(schedule, *extra):
    return [
        "--parallelism.pipeline_parallel_degree=2",
        f"--parallelism.pipeline_parallel_schedule={schedule}",
        *extra,
    ]


@pytest.fixture(scope="module", autouse=True)
def offline_env(monkeypatch_module):
    for k, v in train_env().items():
        monkeypatch_module.setenv(k, v)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as m:
        yield m


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, worker_id):
    # trained once per session with tests/test_parity.py's and test_parity_cp.py's runs (test_parity.parity_runs)
    return parity_runs(tmp_path_factory, worker_id)["pp-baseline"]


def check(baseline, rows, label):
    lines, worst = compare(baseline, rows, RTOL)
    print(f"{label}: worst relative difference", worst)
    assert len(rows) == 10
    assert all(v <= RTOL for v in worst.values()), "\n".join([label, *lines])


# name: (processes, arguments); the layouts of one world size train in one torchrun (test_parity.parity_runs)
LAYOUTS = {
    # 4 ranks: pp 2 x dp_shard 2, local batch 2 per dp rank -> 2 micro-batches of 1 sequence
    "pp2_fsdp2_GPipe": (4, ["--training.local_batch_size=2", *pp("GPipe")]),
    "pp2_fsdp2_1F1B": (4, ["--training.local_batch_size=2", *pp("1F1B")]),
    # 4 ranks: pp 2 x tp 2 (sequence + loss parallel, the defaults), dp 1; 4 micro-batches, 1F1B
    "pp2_tp2": (4, pp("1F1B", "--parallelism.tensor_parallel_degree=2", "--training.local_batch_size=4")),
    # 2 ranks x 2 stages (layers 0 | 1-2 | 3-4 | 5), 4 micro-batches
    "interleaved_1f1b": (
        2,
        pp(
            "Interleaved1F1B",
            "--parallelism.pipeline_parallel_stages_per_rank=2",
            "--training.local_batch_size=4",
        ),
    ),
    # V placement: rank 0 holds stages 0 and 3 (embedding and head), rank 1 stages 1 and 2; uneven split
    "zbv_split_points": (
        2,
        pp(
            "ZBVZeroBubble",
            "--parallelism.pipeline_parallel_stages_per_rank=2",
            "--parallelism.pipeline_parallel_split_points=layers.1,layers.3,layers.5",
            "--training.local_batch_size=4",
        ),
    ),
}


@pytest.fixture(scope="module")
def layouts(tmp_path_factory, worker_id):
    # each layout after COMMON, trained with the baseline (above)
    rows = parity_runs(tmp_path_factory, worker_id)
    return {name: rows[f"pp-{name}"] for name in LAYOUTS}


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
def test_pp2_fsdp2(baseline, layouts, schedule):
    check(baseline, layouts[f"pp2_fsdp2_{schedule}"], f"PP 2 x FSDP 2, {schedule}")


def test_pp2_tp2(baseline, layouts):
    check(baseline, layouts["pp2_tp2"], "PP 2 x TP 2, 1F1B")


def test_interleaved_1f1b(baseline, layouts):
    check(baseline, layouts["interleaved_1f1b"], "PP 2, Interleaved1F1B")


def test_zero_bubble_v_with_split_points(baseline, layouts):
    check(baseline, layouts["zbv_split_points"], "PP 2, ZBVZeroBubble, split points")


def test_interleaved_zero_bubble_gradients_per_parameter(tmp_path):
    """Every parameter's gradient after one step equals the single-process one (not only their norm).

    This is the check that caught zero-bubble schedules dropping the weight gradients of blocks FSDP had
    resharded after forward (the last stage's blocks got none), which a loss curve shows only from step 2.
    """

    def dump(nproc, name, *args):
        out = tmp_path / name
        common = [*TINY, "--training.local_batch_size=4", "--training.mixed_precision_param=float32"]
        r = run_script(nproc, "tests/dist/dump_grads.py", [str(out), *common, *args], timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        merged = {}
        for rank in range(nproc):
            part = torch.load(f"{out}.{rank}", weights_only=True)
            loss = part.pop("loss")
            merged.update(part)
            merged.setdefault("losses", []).append(loss.item())
        return merged

    one = dump(1, "one")
    zb = dump(2, "zb", *pp("InterleavedZeroBubble", "--parallelism.pipeline_parallel_stages_per_rank=2"))
    assert zb.pop("losses") == [
        0.0,
        pytest.approx(one.pop("losses")[0], rel=1e-6),
    ]  # loss on the last stage only
    assert zb.keys() == one.keys()
    for name in one:
        torch.testing.assert_close(zb[name], one[name], rtol=1e-4, atol=1e-6, msg=name)
