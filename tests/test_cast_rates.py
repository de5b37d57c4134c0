"""torch's dtype-converting copies timed in a CUDA trace (scripts/cast_rates.py) and the estimator's pricing of eager
RoPE's bf16 -> fp32 upcasts (steptime.eager_rope_upcast_extra, rates.EAGER_UPCAST_FRACTION): the script on a trace
written by hand, the constant against the figures the script gave on the H200 traces of docs/performance.md, command
f, and where the estimator adds the upcasts' time."""

import json
import statistics

import pytest

from conftest import import_script
from torchtitan.config import parse_args
from torchtitan.estimate import rates, steptime
from torchtitan.estimate.plan import build_plan

CASTS = import_script("cast_rates")


def _x(name, ts, dur, cat="cpu_op", tid=1, **args):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "pid": 1, "cat": cat, "args": args}


def _trace(tmp_path):
    """Three upcasts of a 1000 x 8 bf16 tensor (unrolled kernels of 10, 12 and 30 us; the last beside another
    stream's kernel), a downcast (vectorized, 4 us) and a same-dtype copy (not a cast)."""
    events = [_x("ProfilerStep#7", 0, 10_000, cat="user_annotation")]
    up = {"Input Dims": [[1000, 8], [1000, 8], []], "Input type": ["float", "c10::BFloat16", "Scalar"]}
    down = {"Input Dims": [[1000, 8], [1000, 8], []], "Input type": ["c10::BFloat16", "float", "Scalar"]}
    same = {"Input Dims": [[1000, 8], [1000, 8], []], "Input type": ["float", "float", "Scalar"]}
    copies = ((1, up, "unrolled_elementwise_kernel<copy_kernel>", 100, 10), (2, up, "unrolled_elementwise_kernel<c>", 200, 12),
              (3, up, "unrolled_elementwise_kernel<c>", 300, 30), (4, down, "vectorized_elementwise_kernel<c>", 400, 4),
              (5, same, "vectorized_elementwise_kernel<c>", 500, 3))  # fmt: skip
    for ext, args, kernel, ts, dur in copies:
        events += [_x("aten::copy_", ts - 50, 10, **{"External id": ext, **args}),
                   _x(kernel, ts, dur, cat="kernel", tid=7, **{"External id": ext})]  # fmt: skip
    events.append(_x("Memcpy DtoD", 310, 5, cat="gpu_memcpy", tid=18))  # beside the third upcast
    events += [
        _x("other_kernel", 600 + 10 * i, 5, cat="kernel", tid=7) for i in range(20)
    ]  # the compute stream
    p = tmp_path / "rank0_step7.json"
    p.write_text(json.dumps({"traceEvents": events}))
    return p


def test_groups_casts_by_direction_shape_and_kernel_and_times_those_alone(tmp_path):
    rows = {(r["src"], r["dst"], r["kernel"]): r for r in CASTS.cast_rates(_trace(tmp_path))}
    assert set(rows) == {
        ("bf16", "fp32", "unrolled"),
        ("fp32", "bf16", "vectorized"),
    }  # the same-dtype copy is not
    up = rows[("bf16", "fp32", "unrolled")]
    assert (up["copies"], up["alone"], up["bytes"], up["shape"]) == (3, 2, 8000 * (2 + 4), [1000, 8])
    assert up["seconds"] == pytest.approx(11e-6)  # the median of the two alone, 10 and 12 us
    assert rows[("fp32", "bf16", "vectorized")]["seconds"] == pytest.approx(4e-6)


def test_command_prints_fractions_and_rejects_a_cpu_trace(tmp_path, capsys):
    assert CASTS.main([str(_trace(tmp_path)), "--peak-gbps", "10"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("bf16->fp32"))
    assert line.split()[-2:] == ["4", "0.436"]  # 48,000 bytes in 11 us: 4.36 GB/s of 10
    cpu = tmp_path / "cpu.json"
    cpu.write_text(json.dumps({"traceEvents": [_x("ProfilerStep#1", 0, 10, cat="user_annotation")]}))
    assert CASTS.main([str(cpu)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(cpu) in err[0] and "no CUDA kernels" in err[0]


# scripts/cast_rates.py --peak-gbps 4800 on the no-AC and full-AC eager traces of command f (8B, FSDP 8, 1 x 4096, an
# H200): RoPE's bf16 -> fp32 upcasts of q and k, their fraction of the bandwidth alone
H200_UPCASTS = {"q 4096x32x128": (0.382, 0.385), "k 4096x8x128": (0.402, 0.349)}


def _plan(*flags):
    return build_plan(parse_args(["--job.config_file=train_configs/debug_model.toml", "--model.flavor=8B",
                                  "--training.seq_len=4096", "--estimate.hardware=h200", "--estimate.num_devices=8",
                                  *flags]))  # fmt: skip


def test_the_upcast_fraction_is_the_measured_median_and_prices_eager_ropes_upcasts():
    measured = [f for pair in H200_UPCASTS.values() for f in pair]
    assert rates.EAGER_UPCAST_FRACTION == pytest.approx(statistics.median(measured), abs=1e-3)
    plan = _plan()
    r = steptime.Rates(plan)
    s = plan.shape
    nbytes = (2 + 4) * (s.h + s.kv)  # bf16 read, fp32 written, for every element of q and k
    want = nbytes / (rates.EAGER_UPCAST_FRACTION * plan.hw.hbm_gbps * 1e9) - nbytes / r.hbm
    assert steptime.eager_rope_upcast_extra(plan, r) == pytest.approx((want, want), rel=1e-9)
    assert want > 0
    # a compiled block runs RoPE in one kernel; nothing to upcast in fp32 activations
    for flags in (["--compile.enable=true"], ["--training.mixed_precision_param=float32"]):
        p = _plan(*flags)
        assert steptime.eager_rope_upcast_extra(p, steptime.Rates(p)) == (0.0, 0.0), flags


def test_a_blocks_elementwise_time_holds_the_upcasts(monkeypatch):
    """block_pass adds the upcasts' extra time forward and backward (and to the recompute under full AC)."""
    for mode in ("none", "full"):
        plan = _plan(f"--activation_checkpoint.mode={mode}")
        r = steptime.Rates(plan)
        extra, _ = steptime.eager_rope_upcast_extra(plan, r)
        tokens = plan.tokens_per_pass
        with_upcasts = steptime.block_pass(plan, r, mode, tokens)
        monkeypatch.setattr(
            rates, "EAGER_UPCAST_FRACTION", r.hbm / (plan.hw.hbm_gbps * 1e9)
        )  # the elementwise rate
        without = steptime.block_pass(plan, r, mode, tokens)
        monkeypatch.undo()
        assert with_upcasts.elementwise - without.elementwise == pytest.approx(2 * extra * tokens, rel=1e-9)
        assert with_upcasts.recompute - without.recompute == pytest.approx(
            extra * tokens if mode == "full" else 0.0, rel=1e-9, abs=1e-15
        )
