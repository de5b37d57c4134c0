"""scripts/tp_plan_collectives.py: the collectives a block runs under a module-level and a per-linear TP plan,
counted on 2 gloo ranks, against the counts the estimator prices (steptime.tp_block_comm)."""

from __future__ import annotations

from conftest import import_script
from torchtitan.estimate import steptime

tpc = import_script("tp_plan_collectives")


def test_counts_are_the_ones_the_estimator_prices():
    cases = ["module-sp-eager", "linear-sp-eager", "module-sp-compile", "linear-sp-compile", "module-nosp-eager",
             "linear-nosp-eager"]  # fmt: skip
    got = {c: (n["all_gather"], n["reduce_scatter"], n["all_reduce"]) for c, n in tpc.measure(cases).items()}
    # this trainer's plan: 2 all-gathers + 2 reduce-scatters forward and backward (2 all-reduces each without SP)
    assert got["module-sp-eager"] == got["module-sp-compile"] == (4, 4, 0)
    assert got["module-nosp-eager"] == (0, 0, 4)
    extra = steptime.PER_LINEAR_EXTRA_INPUTS
    # per-linear inputs: the backward reduces each linear's input gradient; an eager forward gathers per linear,
    # torch.compile's CSE merges the forward's identical gathers but not the backward's
    assert got["linear-sp-eager"] == (4 + extra, 4 + extra, 0)
    assert got["linear-sp-compile"] == (4, 4 + extra, 0)
    assert got["linear-nosp-eager"] == (0, 0, 4 + extra)


def test_bad_cases_are_one_line_exit_2(capsys):
    assert tpc.main(["--cases=linear-sp-fast"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --cases linear-sp-fast: valid: module-sp-eager")
