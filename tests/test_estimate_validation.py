"""The estimator against published runs (tests/estimate_reference.toml; every row's error is in docs/estimate.md).

Goal, one set of default efficiencies: tokens/s within 15 % and memory within 10 % of every training row,
decode tokens/s within 15 % of every inference row, orderings always right. A row that stays outside is marked
xfail(strict=True) with the reason, so the suite turns red the day it starts passing.
"""

from __future__ import annotations

import pytest

from torchtitan.estimate.validation import cpu_estimate, inference_estimate, load_reference, training_estimate

REF = load_reference()
TPS_GOAL, MEM_GOAL, DECODE_GOAL = 0.15, 0.10, 0.15

# Rows outside the goal with the defaults, and why (docs/estimate.md, "Validation"). Never tuned per row.
OUTSIDE_TPS = {
    "h100_8b_cp4_128k": "measured 1,071 tokens/s is 23% below what the model's FLOPs, attention efficiency and"
    " exposed K/V all-gathers explain (the CP1/CP2 rows fit); the published run's loss at CP>=4 is not modelled",
    "h100_8b_cp8_256k": "measured 548 tokens/s is 26% below the model (same gap as CP 4); see the CP 4 row",
}
OUTSIDE_MEM = {
    "h100_405b_fsdp8_tp8_pp8_1f1b": "pipeline ranks hold ~12 GiB more than the model's states + unsharded"
    " gradient accumulation + in-flight activations; the source gives no breakdown",
    "h100_405b_fsdp8_tp8_pp8_interleaved": "same missing ~10 GiB under pipeline parallelism as the 1F1B row",
}


_CACHE: dict[str, dict] = {}


def training(row_id: str) -> dict:
    if row_id not in _CACHE:
        _CACHE[row_id] = training_estimate(REF, next(r for r in REF["training"] if r["id"] == row_id))
    return _CACHE[row_id]


def _marked(rows, outside: dict):
    return [
        pytest.param(r, id=r["id"], marks=pytest.mark.xfail(strict=True, reason=outside[r["id"]]))
        if r["id"] in outside
        else pytest.param(r, id=r["id"])
        for r in rows
    ]


@pytest.mark.parametrize("row", _marked(REF["training"], OUTSIDE_TPS))
def test_training_tokens_per_sec(row):
    est = training(row["id"])["tokens_per_sec_per_device"]
    err = est / row["tokens_per_sec"] - 1
    assert abs(err) <= TPS_GOAL, (
        f"{row['id']}: estimated {est:,.0f} vs published {row['tokens_per_sec']:,} ({err:+.1%})"
    )


@pytest.mark.parametrize("row", _marked(REF["training"], OUTSIDE_MEM))
def test_training_memory(row):
    r = training(row["id"])
    err = r["memory_gib"] / row["memory_gib"] - 1
    assert abs(err) <= MEM_GOAL, (
        f"{row['id']}: estimated {r['memory_gib']:.1f} vs {row['memory_gib']} GiB ({err:+.1%})"
    )
    assert r["fits"], "a run that was measured must be estimated to fit"


@pytest.mark.parametrize("name", list(REF["orderings"]))
def test_orderings(name):
    ids = REF["orderings"][name]
    published = [next(r for r in REF["training"] if r["id"] == i)["tokens_per_sec"] for i in ids]
    assert published == sorted(published, reverse=True)  # the data file lists them fastest first
    est = [training(i)["tokens_per_sec_per_device"] for i in ids]
    assert est == sorted(est, reverse=True), dict(zip(ids, est))


@pytest.mark.parametrize("row", REF["inference"], ids=[r["id"] for r in REF["inference"]])
def test_inference_tokens_per_sec(row):
    r = inference_estimate(REF, row)
    err = r["tokens_per_sec"] / row["tokens_per_sec"] - 1
    assert abs(err) <= DECODE_GOAL, (
        f"{row['id']}: {r['tokens_per_sec']:.1f} vs {row['tokens_per_sec']} ({err:+.1%})"
    )


OUTSIDE_CPU_RSS = {
    "cpu_debug_1proc": "CPU resident memory keeps what glibc does not return and CPU kernel scratch (oneDNN bf16"
    " reorders, SDPA per-thread buffers): a bare training loop here holds ~0.48 GiB over its runtime, the model"
    " counts ~0.26 GiB of tensors",
    "cpu_debug_2proc": "same as the 1-process row: allocator retention and CPU kernel scratch are not modelled",
}


@pytest.mark.parametrize("row", REF["cpu"], ids=[r["id"] for r in REF["cpu"]])
def test_cpu_step_time_against_measured_run(row):
    """This machine: a real debug-model run and the estimate from a calibration taken on the same machine
    (both stored, measured under `mlock exclusive`; nothing is timed here)."""
    r = cpu_estimate(row)
    err = r["step_time_s"] / row["step_time_s"] - 1
    assert abs(err) <= TPS_GOAL, (
        f"step {r['step_time_s']:.3f} s vs measured {row['step_time_s']} ({err:+.1%})"
    )


@pytest.mark.parametrize("row", _marked(REF["cpu"], OUTSIDE_CPU_RSS))
def test_cpu_rss_against_measured_run(row):
    r = cpu_estimate(row)
    err = r["memory_gib"] / row["max_rss_gib"] - 1
    assert abs(err) <= MEM_GOAL, (
        f"RSS {r['memory_gib']:.3f} vs measured {row['max_rss_gib']} GiB ({err:+.1%})"
    )
