"""A profiled step summed by the estimator's terms (torchtitan/estimate/trace_terms.py, scripts/step_terms.py).

The real trainer traces are read in tests/test_train_e2e.py (its profiled run); here: the classification rules
and the two timelines (CPU self time, CUDA kernels with exposed communication) on traces written by hand, so every
expected second is known."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import import_script
from torchtitan.estimate import validation
from torchtitan.estimate.trace_terms import TERMS, classify, compare, estimated_terms, trace_terms

ROOT = Path(__file__).resolve().parents[1]
STEP_TERMS = import_script("step_terms")  # its main(), for the bad-input cases


@pytest.mark.parametrize(
    "stack, kernel, term",
    [
        (["aten::linear", "aten::matmul", "aten::mm"], None, "matmul"),
        (
            ["aten::linear", "aten::to", "aten::_to_copy", "aten::copy_"],
            None,
            "elementwise",
        ),  # autocast's cast
        (["aten::cross_entropy_loss", "aten::log_softmax", "aten::_log_softmax"], None, "loss"),
        (["aten::cross_entropy_loss", "aten::to", "aten::copy_"], None, "loss"),  # the upcast inside the loss
        (
            ["aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu"],
            None,
            "attention",
        ),
        (
            [
                "autograd::engine::evaluate_function: ScaledDotProductFlashAttentionForCpuBackward0",
                "ScaledDotProductFlashAttentionForCpuBackward0",
            ],
            None,
            "host",
        ),  # autograd's own time
        (["autograd::engine::evaluate_function: LogSoftmaxBackward0", "LogSoftmaxBackward0"], None, "host"),
        (["FSDP::pre_forward (layers.0)"], None, "communication"),  # waiting for the all-gather
        (
            ["FSDP::all_gather_copy_out (layers.0)", "aten::split_with_sizes_copy", "aten::copy_"],
            None,
            "elementwise",
        ),
        (
            [
                "autograd::engine::evaluate_function: RegisterPostBackwardFunctionBackward",
                "RegisterPostBackwardFunctionBackward",
            ],
            None,
            "communication",
        ),
        (["aten::add", "Redistribute"], None, "communication"),  # DTensor's redistribute inside a sharded add
        (["Redistribute", "aten::cat"], None, "elementwise"),  # its copies
        (["Optimizer.step#AdamW.step", "aten::_fused_adamw_"], None, "optimizer"),
        (["aten::linalg_vector_norm"], None, "optimizer"),  # gradient clipping
        ([], None, "host"),
        (["c10d::_allgather_base_"], "ncclDevKernel_AllGather_RING_LL", "communication"),
        (
            ["FSDP::all_gather (layers.0)", "c10d::_allgather_base_", "aten::copy_"],
            "Memcpy DtoD (Device -> Device)",
            "communication",
        ),  # the fake backend's stand-in for the all-gather
        (
            ["FSDP::all_gather (layers.0)", "fsdp::all_gather_copy_in", "aten::_foreach_copy_"],
            "memcpy",
            "elementwise",
        ),
        (["aten::mm"], "sm90_xmma_gemm_bf16bf16_bf16f32", "matmul"),
        (["aten::linear", "aten::addmm"], "nvjet_tst_128x256_64x4", "matmul"),
        (["aten::add"], "void at::native::vectorized_elementwise_kernel<4>", "elementwise"),
        (["aten::cross_entropy_loss"], "void at::native::cunn_SoftMaxForward<4>", "loss"),
        (["aten::_scaled_dot_product_cudnn_attention"], "cudnn_generated_fort_native_sdpa_sm90", "attention"),
        (["CompiledFunction"], "triton_per_fused__log_softmax_nll_loss_3", "loss"),
        (["CompiledFunction"], "triton_poi_fused_mul_silu_7", "elementwise"),
        (["Optimizer.step#AdamW.step"], "void at::native::multi_tensor_apply_kernel", "optimizer"),
    ],
)
def test_classify(stack, kernel, term):
    assert classify(stack, kernel) == term


# (stack, a tensor subclass's dispatch around the same op, term): the CPU's own time of an op
SUBCLASS = [
    (["aten::linear"], False, "host"),  # calls t + matmul: its own time is dispatch
    (["aten::linear", "aten::to", "aten::_to_copy"], False, "host"),  # allocates, then calls copy_
    (["aten::rms_norm", "aten::_fused_rms_norm"], False, "host"),  # on CPU: pow, mean, add, rsqrt, mul inside
    (["aten::rms_norm", "aten::_fused_rms_norm", "aten::pow"], False, "elementwise"),  # calls result_type, to
    (["aten::mul"], False, "elementwise"),  # a scalar's aten::to inside: the mul does the work
    (["aten::add"], True, "host"),  # DTensor's add: sharding propagation, then the local add
    (["aten::mm"], True, "host"),  # DTensor's mm around the local mm
    (["aten::rsqrt"], True, "host"),  # DTensor's op calling Python (a PythonSubclass event) for its local op
    (["aten::add"], False, "elementwise"),  # the local add: the work
    (["aten::_scaled_dot_product_flash_attention_for_cpu"], False, "attention"),  # allocates inside
    (["aten::cross_entropy_loss"], False, "loss"),
    (["aten::linear", "aten::t"], False, "host"),  # a view
    (
        ["Torch-Compiled Region: 0/0", "## Call CompiledFxGraph fabc ##"],
        False,
        "elementwise",
    ),  # Inductor's C++
    (["Torch-Compiled Region: 0/0", "## Call CompiledFxGraph fabc ##", "aten::mm"], False, "matmul"),
    (["aten::empty_strided"], False, "host"),
]


@pytest.mark.parametrize("stack, subclass, term", SUBCLASS)
def test_classify_cpu_dispatch_and_views(stack, subclass, term):
    assert classify(stack, None, subclass) == term


def _x(name, ts, dur, tid=1, cat="cpu_op", **args):
    e = {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "pid": 1, "cat": cat}
    if args:
        e["args"] = args
    return e


def _write(tmp_path, events) -> Path:
    p = tmp_path / "trace.json"
    p.write_text(json.dumps({"traceEvents": events}))
    return p


def test_cpu_trace_self_times_and_gaps(tmp_path):
    events = [
        _x("ProfilerStep#9", 0, 1000, cat="user_annotation"),
        _x("aten::linear", 0, 300),
        _x("aten::mm", 10, 280),  # linear's own 20 us are host (dispatch to mm)
        _x("aten::add", 300, 100),
        # 400-500: inside no event (Python between ops)
        _x("FSDP::pre_forward (layers.0)", 500, 200, cat="user_annotation"),
        _x("aten::copy_", 550, 50),  # a copy inside the hook
        _x("Optimizer.step#AdamW.step", 700, 200, cat="user_annotation"),
        _x("aten::_fused_adamw_", 710, 180),
        # 900-1000: after the optimizer, nothing recorded
        _x("aten::mm", 5, 2, tid=2),  # another thread: not the step's main thread
        _x("aten::mm", 2000, 50),  # outside the step
    ]
    m = trace_terms(_write(tmp_path, events))
    assert m["device"] == "cpu" and m["step_s"] == pytest.approx(1000e-6)
    want = {"matmul": 280, "elementwise": 100 + 50, "communication": 150, "optimizer": 200, "host": 200 + 20,
            "attention": 0, "loss": 0}  # fmt: skip
    assert set(m["terms"]) == set(TERMS)
    for term, us in want.items():
        assert m["terms"][term] == pytest.approx(us * 1e-6, abs=1e-12), term
    assert sum(m["terms"].values()) == pytest.approx(m["step_s"])


def test_cuda_trace_kernels_by_launching_op_and_exposed_communication(tmp_path):
    events = [
        _x("ProfilerStep#9", 0, 1000, cat="user_annotation"),
        _x("aten::mm", 10, 10),
        _x("cudaLaunchKernel", 15, 2, cat="cuda_runtime", correlation=1),
        _x("aten::add", 30, 10),
        _x("cudaLaunchKernel", 35, 2, cat="cuda_runtime", correlation=2),
        _x("c10d::_allgather_base_", 45, 10),
        _x("cudaLaunchKernel", 50, 2, cat="cuda_runtime", correlation=3),
        _x("cudaLaunchKernel", 1500, 2, cat="cuda_runtime", correlation=4),  # the next step's
        _x("sm90_xmma_gemm_bf16", 100, 300, tid=7, cat="kernel", correlation=1),
        _x("vectorized_elementwise_kernel", 400, 100, tid=7, cat="kernel", correlation=2),
        _x("ncclDevKernel_AllGather_RING_LL", 300, 400, tid=8, cat="kernel", correlation=3),  # 200 us exposed
        _x("sm90_xmma_gemm_bf16", 1600, 300, tid=7, cat="kernel", correlation=4),
    ]
    m = trace_terms(_write(tmp_path, events))
    assert m["device"] == "cuda"
    t = m["terms"]
    assert t["matmul"] == pytest.approx(300e-6) and t["elementwise"] == pytest.approx(100e-6)
    assert t["communication"] == pytest.approx(200e-6)  # 300-700 less the compute kernels' 100-500
    assert t["host"] == pytest.approx(400e-6)  # the device idle: 0-100 and 700-1000
    assert sum(t.values()) == pytest.approx(m["step_s"])


def _one_error_line(rc: int, err: str) -> str:
    """The bad-input contract of scripts/step_terms.py: exit 2 and one stderr line "error: ...", returned."""
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: "), (rc, err)
    return lines[0]


def _step_terms_fails(argv: list[str], capsys) -> str:
    """step_terms' main() on argv in this process (no torch start-up per case)."""
    rc = STEP_TERMS.main(argv)
    return _one_error_line(rc, capsys.readouterr().err)


def _step_terms_command_fails(argv: list[str]) -> str:
    """The command itself, once per kind of bad input: what a user runs, traceback-free."""
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "step_terms.py"), *argv], capture_output=True, text=True
    )
    return _one_error_line(r.returncode, r.stderr)


def test_not_a_trace_is_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    no_step = _write(tmp_path, [_x("aten::mm", 0, 10)])
    for path in (bad, no_step, tmp_path / "missing.json"):
        assert str(path) in _step_terms_fails([str(path)], capsys)
    assert _step_terms_command_fails([str(bad)]).startswith(f"error: {bad}")


def test_an_estimate_that_is_not_a_training_estimate_is_one_line_exit_2(tmp_path, capsys):
    trace = _write(tmp_path, [_x("ProfilerStep#1", 0, 10, cat="user_annotation")])
    partial = '{"compute_detail_s": {}, "step_time_breakdown_s": {}, "step_time_s": 1.0}'
    est = tmp_path / "est.json"
    for text in ("[]", "{}", '{"compute_detail_s": {}}', partial, "not json"):
        est.write_text(text)
        line = _step_terms_fails([str(trace), "--estimate", str(est)], capsys)
        assert str(est) in line and "training estimate" in line, (text, line)
    line = _step_terms_command_fails([str(trace), "--estimate", str(est)])
    assert str(est) in line and "training estimate" in line, line


def test_compare_lines_against_a_stored_cpu_estimate(tmp_path):
    """The table against a real estimate (a calibrated CPU row of the validation file): every estimated term is
    printed, and the estimate's terms add up to its step (straggler included)."""
    row = next(r for r in validation.load_reference()["cpu"] if r["id"] == "cpu_debug_2proc_fsdp_1125")
    est = validation.cpu_estimate(row)
    terms = estimated_terms(est)
    assert sum(terms.values()) == pytest.approx(est["step_time_s"])
    m = {"device": "cpu", "step_s": row["step_time_s"], "terms": dict.fromkeys(TERMS, row["step_time_s"] / 7)}
    lines = compare(m, est)
    assert lines[0].split() == ["term", "measured", "ms", "estimated", "ms", "est", "-", "meas"]
    by_term = {ln.split()[0]: ln.split()[1:] for ln in lines[1:-1]}
    for term in ("matmul", "attention", "elementwise", "loss", "communication", "optimizer", "host", "step"):
        assert term in by_term, term
    assert float(by_term["step"][1]) == pytest.approx(est["step_time_s"] * 1e3, abs=0.05)
    assert float(by_term["communication"][1]) == pytest.approx(
        (est["step_time_breakdown_s"]["fsdp_comm_exposed"]) * 1e3, abs=0.05
    )


def test_cpu_records_that_do_not_nest_are_counted_once(tmp_path):
    """An event that ends after its parent (torch.profiler records can) and gloo's asynchronous records on the main
    thread (an isend's `gloo:send` lasts until the peer has received it) do not count the thread's time twice."""
    events = [
        _x("ProfilerStep#3", 0, 1000, cat="user_annotation"),
        _x("aten::add", 0, 300),
        _x("aten::mul", 250, 150),  # starts inside add, ends 100 us after it
        _x("gloo:send", 400, 5000, cat="user_annotation"),  # async: the send completes long after
        _x("aten::mm", 500, 200),
    ]
    m = trace_terms(_write(tmp_path, events))
    t = m["terms"]
    assert t["elementwise"] == pytest.approx(400e-6)  # 0-400, once
    assert t["matmul"] == pytest.approx(200e-6)
    assert t["communication"] == 0 and t["host"] == pytest.approx(400e-6)  # 400-500 and 700-1000
    assert sum(t.values()) == pytest.approx(m["step_s"])
