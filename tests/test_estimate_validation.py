"""The estimator against published runs, cross-validated (tests/estimate_reference.toml; every row's error is in
docs/estimate.md, "Validation").

Goal (issue 24): on the leave-one-source-out errors, tokens/s (and TFLOPS, decode tokens/s, CPU step time) within
15 %, memory within 10 %, GPU-hours within 25 % on every row, and a median absolute error of at most 5 %. A figure
that stays outside is marked xfail(strict=True) with its reason, so the suite turns red the day it starts passing.
"""

from __future__ import annotations

import dataclasses

import pytest

from torchtitan.estimate import validation
from torchtitan.estimate.validation import (
    cross_validated,
    load_reference,
    median_abs_error,
    table,
    training_estimate,
)

REF = load_reference()
CV = cross_validated(REF)

_PP_MEM = (
    "405B 1F1B on PP 8 with float8 all-gather: the published peak (the maximum over all GPUs) is 82.5 GiB, 10 GiB"
    " above its interleaved twin's (estimated within 10 %); the model's states, the stage's unsharded float8"
    " weights and fp32 gradient accumulation and 8 in-flight micro-batches of 15-16 fully checkpointed blocks"
    " leave 18 GiB of the 1F1B rank unexplained"
)
_MI300X = (
    "MI300X (+41..+45 %, the same for bf16, tensorwise and rowwise: float8's extra work is priced right, the"
    " gap is common to all three): flash attention now at CK FA2's published MI300X plateaus (an upper bound for"
    " SDPA's AOTriton) and float8 at hipBLASLt's published 8192^3 rate, but the bf16 GEMM rate is the MAMF measured"
    " with PYTORCH_TUNABLEOP_ENABLED=1 (668 TFLOPS) and the torchtitan run did not tune; no untuned figure at these"
    " shapes is published"
)
_A100 = (
    "A100 cluster of torchtitan's 2024 tables (network not described): priced as DGX A100 (8 x 200 Gb/s per node,"
    " ring bus bandwidth 192 GB/s as NVIDIA measures it), the FSDP traffic hides under compute and every row of"
    " the table is estimated 7-15 % faster than published (this row +15.1 %, the largest model at batch 1); the"
    " compute rates (MAMF 271 of 312 TFLOPS, FA2 73 %) are what a single A100 sustains (FlashAttention-2's"
    " authors train GPT models end-to-end at up to 225 TFLOPS per A100, 72 % MFU; these runs reach ~48 %): what"
    " they lost beyond the model's work is not explained"
)
_MULTI_NODE = (
    "multi-node FSDP at full NVLink-ring speed (NCCL rings use every NIC of the node): the published H200 runs"
    " (32/64 GPUs, compile + float8) run 18-20 % below the estimate, the slowest-GPU pacing included; the"
    " single-GPU H200 runs of this project fit within 6 %: not explained"
)
_SINGLE_MEM = (
    "one-GPU runs of this project (autocast, no FSDP wrapper): the compiled runs' peak depends on what Inductor"
    " keeps between the graphs, which the activation model approximates per op"
)
_TP8_8B_ROWWISE = (
    "Llama 3 8B, FSDP 8 x TP 8, float8 rowwise, torchtitan 820504e (out of sample: vanilla +19.4 %, async +28.0 %):"
    " the source itself flags this baseline as low (pytorch/torchtitan#1207, whose root cause is that with the"
    " toml's filter (output only) the attention wk/wv linears, 4096 x 1024 sharded to 128 columns per TP rank,"
    " run ~40 % slower in float8 rowwise than in bf16; fixed by torchao#2410 / torchtitan#1319's per-recipe layer"
    " filter): the estimator prices each converted shard at the CUTLASS rowwise rate for its shape, not that build's"
    " slowdown; the 70B rowwise rows, whose shards are 8x larger, fit (+7.6 / +14.7 %)"
)
_TP8_8B_ASYNC = (
    "Llama 3 8B, FSDP 8 x TP 8, async TP, bf16 (out of sample +18.9 %; vanilla TP +13.5 %): the published async-TP"
    " gain is 1.10, the estimate's 1.15 (one exposed fraction, 0.5, for every shape) and the vanilla baseline is"
    " already high: 8B split 8 ways leaves per-rank GEMMs with N = 128..1792, whose sustained rate and overlap the"
    " estimator overstates: not explained further"
)
OUTSIDE: dict[tuple[str, str], str] = {
    ("cpu_debug_1proc", "max RSS GiB"): "CPU resident memory keeps what glibc does not return and CPU kernel"
    " scratch (oneDNN bf16 reorders, SDPA per-thread buffers): not modelled",
    ("cpu_debug_2proc", "max RSS GiB"): "same as the 1-process row",
    ("h200_1b_single_compile", "memory GiB"): _SINGLE_MEM,
    ("h200_1b_single_compile_full_ac", "memory GiB"): _SINGLE_MEM,
    ("h200_3b_single_compile", "memory GiB"): _SINGLE_MEM,
    **{(f"a100_{m}", "tokens/s/device"): _A100 for m in ("llama2_70b_fsdp64_b1_sac_op",)},
    ("h200_8b_fsdp32_compile_float8", "tokens/s/device"): _MULTI_NODE,
    ("h200_8b_fsdp64_compile_float8", "tokens/s/device"): _MULTI_NODE,
    ("h100_405b_fsdp8_tp8_pp8_1f1b", "memory GiB"): _PP_MEM,
    (
        "h100_8b_cp4_128k",
        "tokens/s/device",
    ): "CP 4 at 128K: from CP 2 to CP 4 the published throughput per FLOP"
    " drops ~28 % (368 -> 266 TFLOPS per GPU), more than attention efficiency, the fp32 merge of the ring steps,"
    " the exposed K/V all-gathers and torchtitan's repeated K/V (repeat_kv, 2 %) explain (CP 1 and 2 fit)",
    ("h100_8b_cp8_256k", "tokens/s/device"): "CP 8 at 256K: same as CP 4",
    **{
        (f"mi300x_8b_fsdp8_b1_{r}_torchao", "tokens/s/device"): _MI300X
        for r in ("bf16", "tensorwise", "rowwise")
    },
    (
        "llama2_34b_gpu_hours",
        "GPU-hours",
    ): "Llama 2 34B GPU-hours (out of sample -26.8 %; 13B -21.8 %, 7B -13.9 %,"
    " 70B -11.1 %): the paper's figures imply ~109 model TFLOPS per A100 for 34B against 118-134 for 7B, 13B and"
    " 70B, and the layout behind them is not published (HSDP 64 x 16 with full AC is this file's assumption, the"
    " 70B rule); the estimate's rate is nearly flat across the four sizes",
    ("h100_8b_fsdp8_tp8_rowwise_2025_06", "tokens/s/device"): _TP8_8B_ROWWISE,
    ("h100_8b_fsdp8_async_tp8_rowwise_2025_06", "tokens/s/device"): _TP8_8B_ROWWISE,
    ("h100_8b_fsdp8_async_tp8_bf16_2025_06", "tokens/s/device"): _TP8_8B_ASYNC,
}


def _params():
    out = []
    for x in CV:
        key = (x["id"], x["what"])
        marks = [pytest.mark.xfail(strict=True, reason=OUTSIDE[key])] if key in OUTSIDE else []
        out.append(pytest.param(x, id=f"{x['id']}-{x['what'].replace(' ', '_')}", marks=marks))
    return out


@pytest.mark.parametrize("row", _params())
def test_cross_validated_row_within_goal(row):
    assert abs(row["error"]) <= row["goal"], (
        f"{row['id']} {row['what']}: estimated {row['estimated']:,.4g} vs published {row['published']:,.4g}"
        f" ({row['error']:+.1%}, goal ±{row['goal']:.0%})"
    )


def test_outside_list_names_real_rows():
    keys = {(x["id"], x["what"]) for x in CV}
    assert set(OUTSIDE) <= keys, set(OUTSIDE) - keys


@pytest.mark.xfail(
    strict=True, reason="median absolute cross-validated error is 5.8 % over all figures (goal 5 %)"
)
def test_cross_validated_median_error():
    assert median_abs_error(CV) <= 0.05, f"{median_abs_error(CV):.1%}"


def test_nothing_is_fitted_so_cross_validation_equals_in_sample():
    """FITTED is empty (every rate has a source): each source's held-out errors are the in-sample errors."""
    assert validation.FITTED == {}
    ins = {(x["id"], x["what"]): x["estimated"] for x in table(REF)}
    assert {(x["id"], x["what"]): x["estimated"] for x in CV} == ins


def test_cross_validation_never_sees_the_held_out_source(monkeypatch):
    """With a constant to fit, each source's constants are chosen on the other sources' rows only, and the
    held-out source's rows are then estimated with them."""
    keep = {"titan_h200", "ours_cpu"}
    ref = dict(REF, training=[r for r in REF["training"] if r["source"] in keep], inference=[])
    asked: list[frozenset] = []
    real_table = validation.table

    def spy(r, eff=validation.DEFAULT, sources=None):
        asked.append(frozenset(sources or ()))
        return real_table(r, eff, sources)

    monkeypatch.setattr(validation, "table", spy)
    for held_out in keep:
        asked.clear()
        eff = validation.fit(ref, held_out, {"hbm": (0.5, 0.8)})
        assert len(asked) == 2 and all(held_out not in s and s for s in asked), asked
        assert eff.hbm in (0.5, 0.8)
    rows = validation.cross_validated(ref, fitted={"hbm": (0.5, 0.8)})
    assert {x["source"] for x in rows} == keep
    assert all(x["fitted"]["hbm"] in (0.5, 0.8) for x in rows)


def test_power_limit_slows_compute_only():
    row = next(r for r in REF["training"] if r["id"] == "h100_8b_fsdp8_compile")
    at_500 = training_estimate(REF, row)
    ref_700 = dict(REF)
    ref_700["parts"] = {
        "h100_96gb_500w": {k: v for k, v in REF["parts"]["h100_96gb_500w"].items() if k != "power_limit_w"}
    }
    at_700 = training_estimate(ref_700, row)
    assert at_700["tokens_per_sec_per_device"] > 1.15 * at_500["tokens_per_sec_per_device"]
    assert at_700["memory_gib"] == at_500["memory_gib"]


ORDERINGS_OUTSIDE: dict[str, str] = {}


def test_composite_rms_norm_slows_eager_only():
    """torch before 2.9 ran RMSNorm outside compile as separate kernels (--estimate.eager_rms_norm=composite)."""
    eager = next(r for r in REF["training"] if r["id"] == "h100_8b_fsdp8_eager")
    compiled = next(r for r in REF["training"] if r["id"] == "h100_8b_fsdp8_compile")
    for row, slower in ((eager, True), (compiled, False)):
        fused = dict(
            row, estimate_args=[a for a in row.get("estimate_args", []) if "eager_rms_norm" not in a]
        )
        composite = dict(row, estimate_args=[*fused["estimate_args"], "--estimate.eager_rms_norm=composite"])
        t_fused = training_estimate(REF, fused)["step_time_s"]
        t_composite = training_estimate(REF, composite)["step_time_s"]
        assert (t_composite > 1.02 * t_fused) if slower else (t_composite == t_fused), row["id"]


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=[pytest.mark.xfail(strict=True, reason=ORDERINGS_OUTSIDE[n])])
        if n in ORDERINGS_OUTSIDE
        else n
        for n in REF["orderings"]
    ],
)
def test_orderings(name):
    ids = REF["orderings"][name]
    published = [next(r for r in REF["training"] if r["id"] == i)["tokens_per_sec"] for i in ids]
    assert published == sorted(published, reverse=True)  # the data file lists them fastest first
    est = [next(x for x in CV if x["id"] == i and x["what"] == "tokens/s/device")["estimated"] for i in ids]
    assert est == sorted(est, reverse=True), dict(zip(ids, est))


def test_every_measured_run_fits():
    for row in REF["training"]:
        if "memory_gib" in row:
            assert training_estimate(REF, row)["fits"], row["id"]


def test_efficiency_fields_are_not_rates():
    """Compute rates live in rates.py with their sources; Efficiency keeps bandwidth fractions and structure."""
    names = {f.name for f in dataclasses.fields(validation.DEFAULT)}
    assert not names & {"matmul_bf16", "matmul_fp8", "attention_fwd", "attention_bwd"}


def test_device_rates_reproduce_their_measurements():
    """Each per-device rate, asked at the shape its source measured, returns the source's figure: the H100 at 500 W
    (FBGEMM's 585.23 TFLOPS bf16 at 8192^3), MI300X float8 (hipBLASLt's 907 TFLOPS at 8192^3) and MI300X flash
    attention (CK FA2's 353.22 forward / 194.43 backward TFLOPS, non-causal, 16K)."""
    from torchtitan.estimate import rates

    h100 = (
        989.0
        * rates.gemm_efficiency("H100 SXM", "bf16", 8192, 8192, 8192)
        * rates.power_factor("H100 SXM", 500.0)
    )
    assert h100 == pytest.approx(rates.H100_500W_BF16_8192, rel=1e-6)
    mi_fp8 = 2615.0 * rates.gemm_efficiency("MI300X", "fp8", 8192, 8192, 8192)
    assert mi_fp8 == pytest.approx(rates.MI300X_FP8_8192, rel=1e-6)
    fwd = 1307.0 * rates.attention_fraction("MI300X", 16384, backward=False, causal=False)
    bwd = 1307.0 * rates.attention_fraction("MI300X", 16384, backward=True, causal=False)
    assert fwd == pytest.approx(rates.FA2_MI300X_FWD_16K, rel=1e-6)
    assert bwd == pytest.approx(rates.FA2_MI300X_BWD_16K, rel=1e-6)
    # the H100 curve is untouched by the MI300X figures
    assert 989.0 * rates.attention_fraction("H100 SXM", 16384, backward=False, causal=False) == pytest.approx(
        370.0
    )
