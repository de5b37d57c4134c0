"""scripts/tp_plan_collectives.py: the collectives a block runs under a module-level and a per-linear TP plan,
counted on 2 gloo ranks, against the counts the estimator prices (steptime.tp_input_collectives, under
steptime.tp_block_comm and steptime.sp_layout_copy_bytes)."""

from __future__ import annotations

from conftest import import_script
from torchtitan.config import parse_args
from torchtitan.estimate import steptime
from torchtitan.estimate.plan import build_plan

tpc = import_script("tp_plan_collectives")


def priced(case: str) -> tuple[int, int, int]:
    """(all-gathers, reduce-scatters, all-reduces) of one forward + backward the estimator prices for `case`."""
    plan, sp, mode = case.split("-", 2)
    argv = ["--model.flavor=8B", "--estimate.hardware=h100-sxm", "--estimate.num_devices=2",
            "--parallelism.tensor_parallel_degree=2", "--parallelism.data_parallel_shard_degree=1",
            f"--parallelism.enable_sequence_parallel={'true' if sp == 'sp' else 'false'}",
            f"--compile.enable={'true' if mode == 'compile' else 'false'}", f"--estimate.tp_inputs={plan}"]  # fmt: skip
    attn, ffn, input_grads = steptime.tp_input_collectives(build_plan(parse_args(argv)))
    if sp == "sp":  # forward: the inputs' gathers and wo's / w2's reduce-scatters; backward the reverse
        return attn + ffn + 2, 2 + input_grads, 0
    return 0, 0, 2 + input_grads  # wo's / w2's all-reduces forward, the inputs' gradients backward


def test_counts_are_the_ones_the_estimator_prices():
    cases = ["module-sp-eager", "linear-sp-eager", "module-sp-compile", "linear-sp-compile", "module-nosp-eager",
             "linear-nosp-eager"]  # fmt: skip
    got = {c: (n["all_gather"], n["reduce_scatter"], n["all_reduce"]) for c, n in tpc.measure(cases).items()}
    assert got == {c: priced(c) for c in cases}
    # as measured: this trainer's plan 4 + 4; per linear, the eager forward gathers per linear and the backward
    # reduces each linear's input gradient, and torch.compile's CSE merges the forward's gathers only
    assert got["module-sp-eager"] == (4, 4, 0) and got["linear-sp-eager"] == (7, 7, 0)
    assert got["linear-sp-compile"] == (4, 7, 0) and got["linear-nosp-eager"] == (0, 0, 7)


def test_bad_cases_are_one_line_exit_2(capsys):
    assert tpc.main(["--cases=linear-sp-fast"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --cases linear-sp-fast: valid: module-sp-eager")
