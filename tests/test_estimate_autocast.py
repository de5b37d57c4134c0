"""The estimator's traffic under autocast (torchtitan/estimate/steptime.py, `autocast_eager_bytes` and
`autocast_weight_cast_bytes`) against the op stream one block of this trainer really runs
(scripts/eager_elementwise_bytes.py: every aten op's tensor bytes, CPU standing in for CUDA, the norm counted as
CUDA's fused kernels unless said otherwise) and the graphs a compiled block runs (scripts/compiled_weight_casts.py). docs/estimate_log.md, "Eager under autocast: the casts and fp32 traffic
measured"."""

from __future__ import annotations

import sys

import pytest

from conftest import ROOT
from torchtitan.config import parse_args
from torchtitan.estimate import build_plan
from torchtitan.estimate.steptime import (
    Rates,
    autocast_eager_bytes,
    autocast_weight_cast_bytes,
    autocast_weight_grad_upcast,
    block_pass,
    eager_norm_extra,
    eager_upcast_extra,
    elementwise_bytes,
)

sys.path.insert(0, str(ROOT / "scripts"))
from eager_elementwise_bytes import per_token, summary  # noqa: E402

ONE_H100 = ["--model.flavor=debugmodel", "--training.seq_len=64", "--training.mixed_precision_param=bfloat16",
            "--estimate.hardware=h100-sxm", "--estimate.num_devices=1"]  # fmt: skip
SAC_OP = ["--activation_checkpoint.mode=selective", "--activation_checkpoint.selective_ac_option=op"]


def _measured_extra(norm: str) -> tuple[dict, dict]:
    """Per phase: (bytes per token, bytes per pass) the autocast block moves beyond the plain-bf16 one."""
    auto = summary(per_token("debugmodel", "op", "autocast", norm))
    bf16 = summary(per_token("debugmodel", "op", "bf16", norm))
    per_tok = {p: auto[p][0] - bf16[p][0] for p in auto}
    per_pass = {p: auto[p][1] - bf16[p][1] for p in auto}
    return per_tok, per_pass


@pytest.mark.parametrize("norm", ["fused", "composite"])
def test_autocast_bytes_match_the_measured_op_stream(norm):
    """Per token and block: forward, backward and per-op SAC recompute bytes of the fp32 stream's norms and adds and
    of the five activation casts (and their backward) are exactly what autocast adds to the block's measured op
    stream; per pass, the weights' casts (6 bytes per parameter in each of the three phases)."""
    plan = build_plan(parse_args([*ONE_H100, *SAC_OP, f"--estimate.eager_rms_norm={norm}"]))
    assert plan.autocast and not plan.compile_model and plan.shape.fused_norm == (norm == "fused")
    per_tok, per_pass = _measured_extra(norm)
    fwd, bwd, rec = autocast_eager_bytes(plan)
    assert (per_tok["forward"], per_tok["backward"], per_tok["recompute"]) == pytest.approx(
        (fwd, bwd, rec), abs=1
    )
    assert fwd > 0 and bwd > 0 and rec > 0
    weights = autocast_weight_cast_bytes(plan, plan.block_linears)
    assert weights == pytest.approx(6 * sum(lin.in_features * lin.out_features for lin in plan.block_linears))
    for phase in ("forward", "backward", "recompute"):
        assert per_pass[phase] == pytest.approx(weights, rel=1e-3), phase


def test_autocast_bytes_are_priced_in_eager_blocks_only():
    """block_pass adds the term to an eager autocast block's elementwise time (forward, backward and the weight
    casts); a compiled block gets the weight casts only (Inductor fuses the stream's norms, adds and casts), and
    an FSDP-wrapped (bf16-stream, no autocast) block none of it."""
    plan = build_plan(parse_args([*ONE_H100, *SAC_OP]))
    r, tokens = Rates(plan), plan.tokens_per_pass
    ew_f, ew_b = elementwise_bytes(plan)
    a_f, a_b, _ = autocast_eager_bytes(plan)
    w = autocast_weight_cast_bytes(plan, plan.block_linears)
    norm_f, norm_b = eager_norm_extra(plan, r)  # the fused norms at their measured rate (H100: the H200's)
    up_f, up_b = eager_upcast_extra(plan, r)  # the bf16 -> fp32 upcasts at their measured rate
    up_w = autocast_weight_grad_upcast(plan, r, plan.block_linears)  # the weight gradients' upcasts, per pass
    assert norm_f > 0 and norm_b > 0 and up_f > 0 and up_b > up_f and up_w > 0
    expected = (
        ((ew_f + ew_b + a_f + a_b) * tokens + 2 * w) / r.hbm + (norm_f + norm_b + up_f + up_b) * tokens + up_w
    )
    assert block_pass(plan, r, "op", tokens).elementwise == pytest.approx(expected)
    compiled = build_plan(parse_args([*ONE_H100, *SAC_OP, "--compile.enable=true"]))
    assert autocast_eager_bytes(compiled) == (0.0, 0.0, 0.0)
    assert autocast_weight_cast_bytes(compiled, compiled.block_linears) == w
    fsdp = build_plan(parse_args([*ONE_H100, *SAC_OP, "--estimate.num_devices=2"]))
    assert autocast_eager_bytes(fsdp) == (0.0, 0.0, 0.0)
    assert autocast_weight_cast_bytes(fsdp, fsdp.block_linears) == 0.0


@pytest.mark.parametrize("ac", ["none", "op"])
def test_compiled_weight_casts_match_the_partitioned_graphs(ac):
    """A compiled autocast block (scripts/compiled_weight_casts.py: the graphs Inductor's partitioner gives it) casts
    every linear weight to bf16 once forward and converts every weight gradient to fp32 backward; per-op SAC recasts
    the weights in backward, no AC keeps the bf16 copies: as block_pass prices them (forward, backward, and recompute
    where the mode recomputes)."""
    from compiled_weight_casts import weight_casts

    seen, n = weight_casts(ac)
    assert seen["forward"] == {"to_bf16": n, "to_fp32": 0}
    assert seen["backward"] == {"to_bf16": n if ac == "op" else 0, "to_fp32": n}
    argv = [*ONE_H100, "--compile.enable=true", *(SAC_OP if ac == "op" else [])]
    plan = build_plan(parse_args(argv))
    assert sum(lin.in_features * lin.out_features for lin in plan.block_linears) == n
    r, tokens, mode = Rates(plan), plan.tokens_per_pass, "op" if ac == "op" else "none"
    ew_f, ew_b = elementwise_bytes(plan)
    assert (
        autocast_weight_cast_bytes(plan, plan.block_linears) == 6 * n
    )  # 4 bytes read, 2 written per element
    p = block_pass(plan, r, mode, tokens)
    assert p.elementwise == pytest.approx(((ew_f + ew_b) * tokens + 2 * 6 * n) / r.hbm)  # forward + backward
