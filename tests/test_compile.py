"""torch.compile per block (+ the loss) against eager: one run, because compiling takes minutes on 2 shared cores."""

from __future__ import annotations

from conftest import FIXED_PEAK, TINY, import_script


def test_compile_matches_eager_with_selective_ac(monkeypatch):
    """Compiled blocks (with selective per-op AC inside the graph, FSDP2 hooks around it, on 2 ranks) and compiled
    loss vs the same run in eager mode on one process, fp32, 10 steps.

    rtol 1e-5: Inductor fuses elementwise chains and may reorder the fp32 reductions of RMSNorm, softmax and
    log-softmax, which changes results by a few ulps (~1e-7 relative) per op; ten steps of Adam amplify that,
    but stay far below 1e-5 (measured worst over 10 steps: 1.2e-7 for loss and grad norm). A real miscompile, a wrong
    AC policy under compile or a skipped hook moves the loss by far more than that.
    """
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    lc = import_script("loss_compare")
    # the compiled run uses FSDP 2 (1 sequence per rank), so FSDP2's hooks around compiled blocks are covered;
    # data.num_shards=2 gives both runs the same global batches
    common = [
        *TINY,
        FIXED_PEAK,
        "--training.steps=10",
        "--activation_checkpoint.mode=selective",
        "--data.num_shards=2",
    ]
    ok, report, worst = lc.loss_compare(
        [],
        ["--compile.enable=true", "--compile.components=model,loss", "--training.local_batch_size=1"],
        nproc_b=2,
        common=common,
        rtol=1e-5,
    )
    print(report)
    assert ok, report
