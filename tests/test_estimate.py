"""The estimator's interface and its building blocks: config, JSON keys, CLI, search, inference, calibration,
the [model] shape fields, the hardware table. (Its accuracy: tests/test_estimate_validation.py.)"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from unittest import mock

import pytest
import torch

from conftest import ROOT, TINY, run_train, train_env
from torchtitan.config import help_text, parse_args
from torchtitan.config.job_config import Estimate
from torchtitan.config.manager import ConfigError
from torchtitan.errors import UserError
from torchtitan.estimate import (
    build_plan,
    estimate_inference,
    estimate_plan,
    estimate_training,
    generation_latency,
    resolve_hardware,
)
from torchtitan.estimate.__main__ import main as estimate_main
from torchtitan.estimate.activations import BlockShape, backward_working_set_per_token, saved_per_token
from torchtitan.estimate.calibrate import calibrate_inference
from torchtitan.estimate.efficiency import DEFAULT
from torchtitan.estimate.plan import Calibration
from torchtitan.estimate.search import layout_flags, search
from torchtitan.estimate.training import float8_flops_per_token
from torchtitan.metrics.hardware import DEVICE_SPECS, ESTIMATOR_SPECS, device_spec
from torchtitan.models import model_args_from_config
from torchtitan.models.llama3 import Transformer, get_model_args, llama3_flavors

H100 = ["--estimate.hardware=h100-sxm"]
EIGHT_B = ["--model.flavor=8B", "--training.seq_len=8192", "--training.local_batch_size=2"]

TRAINING_KEYS = {"fits", "memory_gib", "memory_breakdown_gib", "step_time_s", "step_time_breakdown_s",
                 "tokens_per_sec_per_device", "mfu_percent"}  # fmt: skip
MEMORY_KEYS = {"parameters", "gradients", "optimizer_states", "activations", "logits_loss", "fsdp_buffers",
               "float8_extras", "allocator_and_comm_overhead"}  # fmt: skip
TIME_KEYS = {"compute", "recompute", "fsdp_comm_exposed", "tp_comm_exposed", "cp_comm_exposed", "pp_comm_exposed",
             "pipeline_bubble", "optimizer", "straggler"}  # fmt: skip


def estimate(*argv) -> dict:
    return estimate_training(parse_args([*H100, *argv]))


# ---------------------------------------------------------------- config section and CLI


def test_estimate_section_parses_strictly_and_shows_in_help():
    cfg = parse_args(["--estimate.num_devices=256", "--estimate.total_tokens=15e12", "--estimate.search"])
    assert (cfg.estimate.num_devices, cfg.estimate.total_tokens, cfg.estimate.search) == (256, 15e12, True)
    with pytest.raises(ConfigError, match="estimate.num_device"):
        parse_args(["--estimate.num_device=8"])
    with pytest.raises(ConfigError, match="'estimate.weight_dtype' got 'fp4'"):
        parse_args(["--estimate.weight_dtype=fp4"])
    text = help_text()
    for key in ("--estimate.hardware", "--estimate.calibrate", "--estimate.search", "--model.ffn_hidden_dim"):
        assert key in text


def test_goodput_stretches_gpu_hours_and_days():
    """GPU-hours and days are the productive time over the expected goodput/percent (docs/metrics.md); a value
    outside (0, 100] is refused with the key named."""
    argv = [*EIGHT_B, "--estimate.num_devices=8", "--estimate.total_tokens=1e12"]
    full, ninety = estimate(*argv), estimate(*argv, "--estimate.goodput_percent=90")
    assert ninety["tokens_per_sec_per_device"] == full["tokens_per_sec_per_device"]  # a step is a step
    assert ninety["gpu_hours"] == pytest.approx(full["gpu_hours"] / 0.9)
    assert ninety["days"] == pytest.approx(full["days"] / 0.9)
    assert (full["goodput_percent"], ninety["goodput_percent"]) == (100.0, 90.0)
    for bad in ("0", "120", "-5"):
        with pytest.raises(UserError, match=r"estimate.goodput_percent = .* must be in \(0, 100\]"):
            estimate(*argv, f"--estimate.goodput_percent={bad}")


def test_json_has_the_issue_keys_and_gpu_hours(tmp_path):
    out = tmp_path / "e.json"
    r = subprocess.run(
        [sys.executable, "-m", "torchtitan.estimate", "--job.config_file=train_configs/llama3_70b.toml",
         "--estimate.hardware=h100-sxm", "--estimate.num_devices=256", "--estimate.total_tokens=15e12",
         f"--estimate.json={out}"],
        cwd=ROOT, env=train_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "tokens/s" in r.stdout and "MFU" in r.stdout and "device-hours" in r.stdout
    data = json.loads(out.read_text())
    assert TRAINING_KEYS | {"gpu_hours", "days"} <= set(data)
    assert set(data["memory_breakdown_gib"]) == MEMORY_KEYS
    assert set(data["step_time_breakdown_s"]) == TIME_KEYS
    assert math.isclose(sum(data["memory_breakdown_gib"].values()), data["memory_gib"], rel_tol=1e-9)
    assert math.isclose(sum(data["step_time_breakdown_s"].values()), data["step_time_s"], rel_tol=1e-9)
    assert math.isclose(data["gpu_hours"], 15e12 / data["tokens_per_sec_per_device"] / 3600)
    assert math.isclose(data["days"], data["gpu_hours"] / 256 / 24)


def test_accuracy_uses_the_comparable_rows_and_widens_when_none_match():
    from torchtitan.estimate import accuracy

    def row(device, layout, error, what="tokens/s/device"):
        return dict(what=what, device=device, layout=layout, error=error, goal=0.15)

    rows = [row("H100 SXM", "data parallel", 0.10), row("H200", "data parallel", -0.02),
            row("H100 SXM", "tensor parallel", 0.30), row("A100", "data parallel", 0.50),
            row("H100 SXM", "data parallel", 0.05, what="memory GiB")]  # fmt: skip
    a = accuracy.comparable(rows, accuracy.family("H200 NVL"), "data parallel", "tokens/s/device")
    assert a["scope"] == "Hopper, data parallel" and a["figures"] == 2
    assert (a["min_error"], a["max_error"], a["within_goal"]) == (-0.02, 0.10, 2)
    assert a["median_error"] == pytest.approx(0.04)
    # no Hopper row with pipeline parallel: the family's every layout; no B200 row at all: every row
    assert accuracy.comparable(rows, "Hopper", "pipeline parallel", "tokens/s/device")["figures"] == 3
    wide = accuracy.comparable(rows, "Blackwell", "data parallel", "tokens/s/device")
    assert wide["scope"] == "every device and layout" and wide["figures"] == 4 and wide["within_goal"] == 2
    assert accuracy.comparable(rows, "Hopper", "data parallel", "decode tokens/s") is None


def test_the_fits_verdict_counts_the_comparable_errors_that_would_turn_it_over():
    """A plan's peak at `ratio` of the capacity: actual = estimate / (1 + error), so a row estimated low by more than
    the headroom (1 + error < ratio) would not fit, and for a plan above the capacity a row estimated high by more than
    the excess (1 + error > ratio) would fit."""
    from torchtitan.estimate import accuracy

    rows = [dict(what="memory GiB", device="H100 SXM", layout="data parallel", error=e, goal=0.10)
            for e in (-0.20, -0.06, -0.03, 0.0, 0.04, 0.12)]  # fmt: skip
    fits = accuracy.comparable(rows, "Hopper", "data parallel", "memory GiB", ratio=0.95)
    assert fits["verdict_flipped_by"] == 2  # -20 % and -6 %: under by more than 5 %
    over = accuracy.comparable(rows, "Hopper", "data parallel", "memory GiB", ratio=1.05)
    assert over["verdict_flipped_by"] == 1  # +12 %: over by more than 5 %
    assert "verdict_flipped_by" not in accuracy.comparable(rows, "Hopper", "data parallel", "memory GiB")
    lines = accuracy.report_lines({"memory GiB": {**fits, "peak_over_capacity": 0.95}})
    assert "5.0 % below the memory the device leaves" in lines[-1]
    assert "2 of these 6 runs' peaks were estimated low by more" in lines[-1]
    assert "would not fit" in lines[-1]


def test_an_80_percent_interval_of_the_errors_puts_the_estimate_in_a_range():
    """With at least RANGE_FIGURES comparable rows, the split-conformal 80 % interval of their errors (the
    floor(0.1 (n + 1))-th and ceil(0.9 (n + 1))-th smallest), and where it puts the estimate's own figure: actual =
    estimate / (1 + error), so the row estimated 30 % high says tokens/s could be 1 / 1.3 of the estimate;
    device-hours and days scale the other way. With fewer rows, no range."""
    from torchtitan.estimate import accuracy

    errors = [-0.10, -0.05, 0.0, 0.02, 0.04, 0.05, 0.06, 0.08, 0.10, 0.30]  # 10 rows
    rows = [dict(what="tokens/s/device", device="H100 SXM", layout="data parallel", error=e, goal=0.15)
            for e in errors]  # fmt: skip
    a = accuracy.comparable(rows, "Hopper", "data parallel", "tokens/s/device")
    # 10 rows: the 1st and the 10th smallest (floor(1.1), ceil(9.9))
    assert (a["p10_error"], a["p90_error"]) == (-0.10, 0.30)
    # 20 rows: the 2nd and the 19th (floor(2.1), ceil(18.9)); 30 rows: the 3rd and the 28th (floor(3.1), ceil(27.9))
    assert accuracy.interval_80(list(range(20, 0, -1))) == (2, 19)
    assert accuracy.interval_80(list(range(1, 31))) == (3, 28)
    assert accuracy.interval_80(list(range(9))) == (0, 8)  # 9 rows: floor(1.0), ceil(9.0)
    with pytest.raises(ValueError, match="at least 9 errors, got 8"):
        accuracy.interval_80(list(range(8)))
    estimate = {"tokens_per_sec_per_device": 1000.0, "gpu_hours": 500.0, "days": 2.0}
    accuracy._expected(estimate, "tokens/s/device", a)
    assert a["expected"] == pytest.approx([1000 / 1.3, 1000 / 0.9])
    assert a["expected_gpu_hours"] == pytest.approx([500 * 0.9, 500 * 1.3])
    assert a["expected_days"] == pytest.approx([2 * 0.9, 2 * 1.3])
    lines = accuracy.report_lines({"tokens/s/device": a})
    assert (
        "an 80 % interval of those errors (-10.0 .. +30.0 %) would put this plan at 769 .. 1,111 tokens/s"
        in lines[1]
    )
    assert "the run at 450 .. 650 device-hours, 1.8 .. 2.6 days" in lines[1]
    few = accuracy.comparable(rows[:9], "Hopper", "data parallel", "tokens/s/device")
    assert "p10_error" not in few
    accuracy._expected(estimate, "tokens/s/device", few)
    assert "expected" not in few and len(accuracy.report_lines({"tokens/s/device": few})) == 1


def test_the_80_percent_interval_holds_a_new_exchangeable_error_at_least_80_percent_of_the_time():
    """The guarantee interval_80 is chosen for: n errors and one more drawn alike (here 10,000 draws of n + 1 from one
    skewed distribution), the interval of the n holds the new one at least 80 % of the time for every n from
    RANGE_FIGURES on; the 10th to 90th percentiles of the same n (statistics.quantiles, inclusive) hold it less often
    for small n, about 0.8 (n - 1) / (n + 1)."""
    import random

    from torchtitan.estimate import accuracy

    rng = random.Random(0)
    for n in (10, 14, 25, 60):
        conformal = deciles = 0
        trials = 10_000
        for _ in range(trials):
            draws = [rng.lognormvariate(0.0, 0.5) - 1.0 for _ in range(n + 1)]
            past, new = draws[:n], draws[n]
            lo, hi = accuracy.interval_80(past)
            conformal += lo <= new <= hi
            d = statistics.quantiles(past, n=10, method="inclusive")
            deciles += d[0] <= new <= d[-1]
        exact = (math.ceil(0.9 * (n + 1)) - math.floor(0.1 * (n + 1))) / (n + 1)
        # 10,000 draws: a standard error of 0.004 on each rate
        assert conformal / trials == pytest.approx(exact, abs=0.015) and exact >= 0.8, n
        assert deciles / trials == pytest.approx(0.8 * (n - 1) / (n + 1), abs=0.015), n


def test_held_out_coverage_builds_each_rows_range_from_the_other_sources():
    """accuracy.held_out_coverage: a row's range comes from the comparable rows of the other sources only, and it
    counts whether the row's own error lies inside; a row with fewer than RANGE_FIGURES such rows has no range."""
    from torchtitan.estimate import accuracy

    def row(source, error):
        return dict(what="memory GiB", device="H200", layout="data parallel", error=error, goal=0.10,
                    source=source)  # fmt: skip

    a = [row("a", e / 100) for e in range(10)]  # 0 .. 9 %: 10 rows, the interval is [0 %, 9 %]
    b = [row("b", e / 100) for e in (-5, 1, 2, 3, 4, 5, 6, 7, 8, 20)]  # [-5 %, 20 %]
    got = accuracy.held_out_coverage([*a, *b])["memory GiB"]
    # a's rows against b's interval: 0 .. 9 %, all 10 inside; b's against a's: 1 .. 8 %, 8 (-5 and 20 % outside)
    assert (got["figures"], got["inside"]) == (20, 18)
    widths = [1.20 / 0.95 - 1] * 10 + [1.09 / 1.00 - 1] * 10
    assert got["median_width"] == pytest.approx(statistics.median(widths))
    assert accuracy.held_out_coverage([*a, *b[:9]]) == {
        "memory GiB": {"figures": 9, "inside": 8, "median_width": pytest.approx(1.09 / 1.00 - 1)}
    }


def test_an_estimate_carries_its_comparable_rows_errors(tmp_path, monkeypatch, capsys):
    """What the CLI adds to a training or inference estimate: the validation table's errors on the rows of the same
    device family and layout kind (here every Hopper FSDP-only row; the A100 single-GPU decode rows), in the report
    and the JSON; off with --estimate.accuracy=false; a clear note when the reference table is not installed."""
    from torchtitan.estimate import accuracy, validation

    out = tmp_path / "e.json"
    argv = ["--model.flavor=8B", *H100, "--estimate.num_devices=8", f"--estimate.json={out}"]
    assert estimate_main(argv) == 0
    text = capsys.readouterr().out
    got = json.loads(out.read_text())["validation"]
    rows = [
        x for x in validation.table() if x["what"] == "tokens/s/device" and x["layout"] == "data parallel"
    ]
    hopper = [x["error"] for x in rows if accuracy.family(x["device"]) == "Hopper"]
    assert got["tokens/s/device"]["scope"] == "Hopper, data parallel"
    assert got["tokens/s/device"]["figures"] == len(hopper) > 10
    assert got["tokens/s/device"]["max_error"] == max(hopper) and "memory GiB" in got
    assert "accuracy   tokens/s/device: on" in text and "(Hopper, data parallel)" in text
    est = json.loads(out.read_text())["tokens_per_sec_per_device"]
    low, high = got["tokens/s/device"]["expected"]
    assert low == pytest.approx(est / (1 + got["tokens/s/device"]["p90_error"])) and low < est < high
    assert f"would put this plan at {low:,.0f} .. {high:,.0f} tokens/s per device" in text
    assert estimate_main([*argv, "--estimate.accuracy=false"]) == 0
    assert "validation" not in json.loads(out.read_text()) and "accuracy" not in capsys.readouterr().out
    # an inference estimate is compared on the decode rows of its family and layout kind (A100, one device), with
    # their cross-validated errors (the decode step's per-layer overhead is fitted: validation.FITTED)
    assert estimate_main(["--model.flavor=8B", "--estimate.mode=inference", "--estimate.hardware=a100",
                          f"--estimate.json={out}"]) == 0  # fmt: skip
    decode = validation.cross_validated(quantities=("decode tokens/s",))
    ampere = [
        x["error"] for x in decode if x["layout"] == "one device" and accuracy.family(x["device"]) == "Ampere"
    ]
    got = json.loads(out.read_text())["validation"]["decode tokens/s"]
    assert got["scope"] == "Ampere, one device" and got["figures"] == len(ampere) > 5 and got["goal"] == 0.15
    assert (got["min_error"], got["max_error"]) == (min(ampere), max(ampere))
    monkeypatch.setattr(validation, "REFERENCE", tmp_path / "missing.toml")
    assert estimate_main(argv) == 0
    assert "is not in this installation" in json.loads(out.read_text())["validation"]["unavailable"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--estimate.hardware=v100"], "unknown hardware 'v100': valid names are a100, h100-sxm"),
        (
            ["--estimate.num_devices=6", "--parallelism.tensor_parallel_degree=4"],
            "world size 6 is not divisible",
        ),
        (["--estimate.num_devices=0"], "estimate.num_devices = 0 must be >= 1"),
        (["--estimate.peak_tflops=-5"], "estimate.peak_tflops = -5.0 must be a positive number"),
        (["--estimate.hardware=cpu"], "estimate.hardware='cpu': peak, memory bandwidth"),
        (["--model.flavor=custom", "--model.dim=512"], "model.flavor='custom' needs the model's shape"),
        (
            ["--estimate.hardware=a100", "--estimate.sm_clock_mhz=1000"],
            "priced only on H100 SXM (boost 1980)",
        ),
        (
            ["--estimate.sm_clock_mhz=2100"],
            "estimate.sm_clock_mhz = 2100 is above the H100 SXM's boost clock",
        ),
        (
            [
                "--estimate.num_devices=8",
                "--estimate.model_dtype=bfloat16",
                "--parallelism.fsdp_cpu_offload=true",
            ],
            "estimate.model_dtype = 'bfloat16' is not priced with parallelism.fsdp_cpu_offload",
        ),
        (
            [
                "--model.flavor=1B",
                "--estimate.num_devices=8",
                "--estimate.model_dtype=bfloat16",
                "--parallelism.fsdp_cpu_offload=true",
                "--estimate.search=true",
            ],
            "search: every layout of 8 devices was refused, the first: estimate.model_dtype",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, argv, message):
    assert estimate_main(["--model.flavor=8B", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


_LAYOUTS = {
    "8B FSDP 8": ["--model.flavor=8B", "--estimate.num_devices=8"],
    "70B FSDP 8 x TP 8": ["--model.flavor=70B", "--estimate.num_devices=64", "--parallelism.tensor_parallel_degree=8"],
    "405B TP 8 x PP 8": ["--model.flavor=405B", "--estimate.num_devices=512", "--parallelism.tensor_parallel_degree=8",
                         "--parallelism.pipeline_parallel_degree=8"],
    "8B CP 4 at 32K": ["--model.flavor=8B", "--estimate.num_devices=16", "--parallelism.context_parallel_degree=4",
                       "--training.seq_len=32768"],
    "8B HSDP 2 x 8": ["--model.flavor=8B", "--estimate.num_devices=16", "--parallelism.data_parallel_replicate_degree=2"],
    "1B one device": ["--model.flavor=1B", "--estimate.num_devices=1"],
}  # fmt: skip
_TECHNIQUES = {
    "eager per-op SAC": [],
    "compile + float8 rowwise": ["--compile.enable=true", "--float8.enable=true", "--float8.recipe=rowwise"],
    "full AC": ["--activation_checkpoint.mode=full"],
}


@pytest.mark.parametrize("hardware", sorted(k for k in {**DEVICE_SPECS, **ESTIMATOR_SPECS} if k != "CPU"))
def test_every_part_and_layout_gives_consistent_figures_or_a_clear_refusal(hardware):
    """What a user planning on any part of the table gets: for each layout and technique, finite figures whose
    breakdowns add up, an MFU in (0, 100) and positive memory, or a one-line UserError (e.g. float8 on a part
    without float8 tensor cores) -- never a crash."""
    for lname, layout in _LAYOUTS.items():
        for tname, technique in _TECHNIQUES.items():
            argv = [f"--estimate.hardware={hardware}", "--training.local_batch_size=1", *layout, *technique]
            if not any(a.startswith("--training.seq_len") for a in argv):
                argv.append("--training.seq_len=8192")
            try:
                r = estimate_training(parse_args(argv))
            except UserError as e:
                assert "\n" not in str(e) and str(e), (hardware, lname, tname)
                continue
            where = (hardware, lname, tname)
            parts = r["step_time_breakdown_s"]
            assert all(math.isfinite(v) and v >= 0 for v in parts.values()), where
            assert math.isclose(sum(parts.values()), r["step_time_s"], rel_tol=1e-9), where
            assert math.isclose(sum(r["memory_breakdown_gib"].values()), r["memory_gib"], rel_tol=1e-9), where
            assert 0 < r["mfu_percent"] < 100 and r["tokens_per_sec_per_device"] > 0, where


# ---------------------------------------------------------------- one FLOPs counter, one hardware table


def test_mfu_uses_the_trainers_flops_counter_and_formula():
    r = estimate(*EIGHT_B, "--estimate.num_devices=8", "--float8.enable=true")
    a = get_model_args("8B")
    assert r["flops_per_token"] == a.flops_per_token(8192)
    mfu = 100 * a.flops_per_token(8192) * r["tokens_per_sec_per_device"] / 989e12
    assert math.isclose(r["mfu_percent"], mfu, rel_tol=1e-12)
    assert "mfu_percent_fp8_mixed" in r and r["mfu_percent_fp8_mixed"] < r["mfu_percent"]
    causal = estimate(
        *EIGHT_B, "--estimate.num_devices=8", "--float8.enable=true", "--metrics.causal_flops=true"
    )
    assert causal["flops_per_token"] == a.flops_per_token(8192, causal=True)


def test_float8_share_is_the_float8_modules():
    from torchtitan.quantize.float8 import float8_flops_per_token as from_model

    cfg = parse_args([*H100, *EIGHT_B, "--float8.enable=true"])
    plan = build_plan(cfg)
    with torch.device("meta"):
        model = Transformer(get_model_args("8B", max_seq_len=16))
    assert float8_flops_per_token(plan) == from_model(model, cfg.float8.min_dim)


def test_hardware_table_covers_the_issue_parts():
    issue_parts = {"A100", "H100 SXM", "H100 PCIe", "H100 NVL", "H200", "H200 NVL", "B200", "L40S", "MI300X"}
    assert issue_parts <= set(DEVICE_SPECS)
    for key, s in DEVICE_SPECS.items():  # every part of the table, the issue's and those added since (GB200)
        assert s.bf16_tflops and s.memory_gib and s.hbm_gbps and s.intra_node_gbps and s.inter_node_gbps, key
    assert device_spec("a100-40gb").memory_gib == 40 and device_spec("a100-40gb").hbm_gbps == 1555
    assert device_spec("cpu") is ESTIMATOR_SPECS["CPU"]


def test_gb200_nvlink_domain_is_the_rack():
    """A GB200 NVL72 rack is one NVLink domain: FSDP over 64 GPUs rings over NVLink at the intra-node rate, where
    64 B200s (8 a node) ring over the network; a GB200 NVL4 board is --estimate.devices_per_node=4. Its GEMMs are
    not Hopper's static persistent kernels."""
    from torchtitan.estimate import collectives

    def plan(hw, *extra):
        return build_plan(
            parse_args([*EIGHT_B, f"--estimate.hardware={hw}", "--estimate.num_devices=64", *extra])
        )

    gb200, b200 = plan("gb200"), plan("b200")
    assert collectives.group_layout(gb200, 64, 1) == (64, 1)
    assert collectives.group_layout(b200, 64, 1) == (8, 8)
    assert collectives.busbw(gb200, 1.0, 0.1, 64, 1) == 1.0
    assert collectives.busbw(b200, 1.0, 0.1, 64, 1) == pytest.approx(0.8)  # 8 NICs of 0.1 per node
    assert collectives.group_layout(plan("gb200", "--estimate.devices_per_node=4"), 64, 1) == (4, 16)
    assert "GB200" not in collectives.STATIC_PERSISTENT_GEMM_DEVICES
    assert device_spec("NVIDIA GB200").bf16_tflops == 2500.0


def test_blackwell_ultra_parts():
    """B300 and GB300 plan like their Blackwell siblings (the GB300's rack one NVLink domain of 72, no persistent-GEMM
    rule) with their own memory, NICs and rates: the B300's 270 GB hold what a B200's 180 cannot, its 800 Gb/s NIC per
    GPU is twice the B200's, and its step is faster than the B200's (power rule, Blackwell Ultra's attention)."""
    from torchtitan.estimate import collectives

    def plan(hw, *extra):
        return build_plan(parse_args([*EIGHT_B, f"--estimate.hardware={hw}", *extra]))

    gb300, b300, b200 = plan("gb300", "--estimate.num_devices=64"), plan("b300"), plan("b200")
    assert collectives.group_layout(gb300, 64, 1) == (64, 1)
    assert device_spec("gb300").devices_per_node == 72 and device_spec("b300").devices_per_node == 8
    assert device_spec("b300").memory_gib == 270.0 and device_spec("gb300").memory_gib == 279.0
    assert device_spec("b300").inter_node_gbps == 2 * device_spec("b200").inter_node_gbps
    assert "GB300" not in collectives.STATIC_PERSISTENT_GEMM_DEVICES
    # a batch that overflows a B200's 180 GB fits a B300
    big = ("--training.local_batch_size=4", "--activation_checkpoint.mode=none")  # ~255 GB a GPU
    assert not estimate(*EIGHT_B, *big, "--estimate.hardware=b200")["fits"]
    assert estimate(*EIGHT_B, *big, "--estimate.hardware=b300")["fits"]
    faster = estimate(*EIGHT_B, "--estimate.hardware=b300")["step_time_s"]
    assert faster < estimate(*EIGHT_B, "--estimate.hardware=b200")["step_time_s"]
    assert b300.hw.name == "B300" and b200.hw.name == "B200"


def test_silicon_twins_run_their_twins_kernels_over_their_own_links():
    """The H800 and A800 are the H100 SXM's and A100's dies with NVLink cut to 200 GB/s each way, the MI325X the
    MI300X's with more memory, bandwidth and power (rates.SILICON_TWINS): a step's compute is the twin's (the
    MI325X's faster: its own GEMM measurement at 1,000 W), TP's collectives slow down by the links' ratio, NCCL's
    channels shrink with the bandwidth, and the MI325X's 256 GB hold a batch an MI300X's 192 cannot."""
    from torchtitan.estimate import accuracy, collectives, rates

    def breakdown(hw, *extra):
        return estimate(*EIGHT_B, f"--estimate.hardware={hw}", *extra)["step_time_breakdown_s"]

    tp8 = ("--parallelism.tensor_parallel_degree=8", "--estimate.num_devices=64")
    for part, twin, links in (("h800", "h100-sxm", 450 / 200), ("a800", "a100", 300 / 200)):
        cut, full = breakdown(part, *tp8), breakdown(twin, *tp8)
        assert cut["compute"] == pytest.approx(full["compute"])
        assert cut["tp_comm_exposed"] == pytest.approx(full["tp_comm_exposed"] * links, rel=0.1)
    assert collectives.node_channels("H800") == pytest.approx(16 * 200 / 450)
    assert collectives.node_channels("A800") == pytest.approx(24 * 200 / 300)
    assert collectives.node_channels("MI325X") == collectives.node_channels("MI300X")
    assert rates.attention_backend("H800") == "cudnn" and rates.attention_backend("A800") == "flash"
    assert [accuracy.family(d) for d in ("H800", "A800", "MI325X")] == ["Hopper", "Ampere", "CDNA 3"]
    assert breakdown("mi325x")["compute"] < breakdown("mi300x")["compute"]
    three = ("--training.local_batch_size=3", "--activation_checkpoint.mode=none")  # ~196 GB a GPU
    assert not estimate(*EIGHT_B, *three, "--estimate.hardware=mi300x")["fits"]
    assert estimate(*EIGHT_B, *three, "--estimate.hardware=mi325x")["fits"]


def test_gh200_runs_the_h100_die_on_a_four_gpu_mesh_node():
    """The GH200's GPU is the H100 SXM's die (rates.SILICON_TWINS) with its own memory: its matmuls and attention
    take the H100's time, its memory-bound work the time its 4.0 (4.9) TB/s allow, and the 144 GB part holds a batch
    the 96 GB one cannot. Its node is four GPUs joined pairwise by NVLink (150 GB/s each way a pair), no switch: a
    ring over 2 of them has one pair's links, a third of the node's; across nodes, one 200 Gb/s NIC per GPU. CSCS's
    nccl-tests between two GH200s on two Alps nodes (all_reduce, 128 MiB: 22.86 GB/s bus bandwidth, cscs-docs
    80abed13), which sets nothing, is reproduced within 10 %."""
    from torchtitan.estimate import accuracy, collectives, rates, steptime
    from torchtitan.estimate.plan import build_plan

    h100 = estimate(*EIGHT_B)["compute_detail_s"]
    with pytest.MonkeyPatch.context() as mp:  # the upcasts at a fraction of the bandwidth, as the rest
        mp.setattr(rates, "BOOST_CLOCK_MHZ", {})
        by_bandwidth = estimate(*EIGHT_B)["compute_detail_s"]
        for hw, tbps in (("gh200", 4.0), ("gh200-144gb", 4.9)):
            got = estimate(*EIGHT_B, f"--estimate.hardware={hw}")["compute_detail_s"]
            assert got["matmul"] == pytest.approx(h100["matmul"])
            assert got["attention"] == pytest.approx(h100["attention"])
            assert got["elementwise"] == pytest.approx(by_bandwidth["elementwise"] * 3.35 / tbps)
    for hw, tbps in (
        ("gh200", 4.0),
        ("gh200-144gb", 4.9),
    ):  # the die's unrolled upcasts do not speed up with it
        got = estimate(*EIGHT_B, f"--estimate.hardware={hw}")["compute_detail_s"]
        assert h100["elementwise"] * 3.35 / tbps < got["elementwise"] < h100["elementwise"]
    none = ("--activation_checkpoint.mode=none",)  # ~138 GB a GPU
    assert not estimate(*EIGHT_B, *none, "--estimate.hardware=gh200")["fits"]
    assert estimate(*EIGHT_B, *none, "--estimate.hardware=gh200-144gb")["fits"]

    plan = build_plan(parse_args([*EIGHT_B, "--estimate.hardware=gh200", "--estimate.num_devices=8"]))
    r = steptime.Rates(plan)
    assert plan.hw.devices_per_node == 4 and collectives.is_mesh(plan)
    assert r.intra == pytest.approx(450e9 * DEFAULT.intra_node)
    assert collectives.busbw(plan, r.intra, r.inter, 4, 1) == pytest.approx(r.intra)
    assert collectives.busbw(plan, r.intra, r.inter, 2, 1) == pytest.approx(r.intra / 3)
    across = collectives.busbw(plan, r.intra, r.inter, 2, 4)  # one GPU on each of two nodes
    assert across == pytest.approx(25e9 * DEFAULT.inter_node)
    assert abs(across / 22.86e9 - 1) < 0.10
    assert collectives.node_channels("GH200") == collectives.node_channels("H100 SXM")
    assert rates.attention_backend("GH200 144GB") == "cudnn" and accuracy.family("GH200") == "Hopper"
    # its accuracy line is the Hopper rows', and says that none of them ran on a GH200
    gh200 = accuracy.accuracy_of(estimate(*EIGHT_B, "--estimate.hardware=gh200"))
    assert gh200["tokens/s/device"]["on_this_part"] == 0
    assert "(Hopper, data parallel; none on the GH200)" in accuracy.report_lines(gh200)[0]
    h100 = accuracy.accuracy_of(estimate(*EIGHT_B))["tokens/s/device"]
    assert h100["on_this_part"] > 0 and h100["figures"] == gh200["tokens/s/device"]["figures"]


def test_report_says_which_power_the_compute_rates_stand_for():
    """The table's compute rates are measurements at a power limit: the report names it ("compute at N W") so a
    plan for a capped part (a GH200 site's module cap, Meta's 500 W H100s) shows whether the cap was given. A limit
    above the part's rated power adds nothing (the rates stop there), and measured rates name none."""
    from torchtitan.estimate import rates
    from torchtitan.estimate.report import training_report

    cases = [
        ("gh200", None, 700.0),
        ("h100-sxm", 500, 500.0),
        ("h100-sxm", 900, 700.0),
        ("mi325x", None, 1000.0),
    ]
    for hw, limit, watts in cases:
        extra = [f"--estimate.power_limit_w={limit}"] if limit else []
        r = estimate(*EIGHT_B, f"--estimate.hardware={hw}", *extra)
        assert r["hardware"]["compute_power_w"] == watts
        assert f"; compute at {watts:.0f} W)" in training_report(r).splitlines()[1]
    assert rates.compute_power_w("CPU", None) is None


def test_fits_reserves_nccl_buffers_for_every_communicator_beyond_the_first():
    """`fits` keeps the CUDA context and one communicator's NCCL buffers (cuda_context_gib) off the device, and
    nccl_communicator_gib more for each further process group a step communicates on: FSDP's, HSDP's replicas,
    TP's, CP's and PP's. A layout is checked against what it leaves usable; the peak itself does not move."""
    from torchtitan.estimate.memory import nccl_communicators
    from torchtitan.estimate.plan import build_plan

    def usable(*argv: str) -> float:
        r = estimate("--model.flavor=8B", "--training.seq_len=8192", "--estimate.num_devices=16", *argv)
        return r["memory_gib"] / r["memory_over_usable"]

    device = device_spec("H100 SXM").memory_gib
    layouts = {
        (): 1,  # FSDP 16
        ("--parallelism.data_parallel_replicate_degree=2",): 2,
        ("--parallelism.tensor_parallel_degree=2",): 2,
        ("--parallelism.tensor_parallel_degree=2", "--parallelism.pipeline_parallel_degree=2"): 3,
        ("--parallelism.context_parallel_degree=2", "--parallelism.tensor_parallel_degree=2"): 3,
        ("--parallelism.tensor_parallel_degree=8", "--parallelism.pipeline_parallel_degree=2"): 2,  # no FSDP
    }
    for flags, groups in layouts.items():
        argv = [*H100, "--model.flavor=8B", "--estimate.num_devices=16", *flags]
        assert nccl_communicators(build_plan(parse_args(argv))) == groups, flags
        reserved = DEFAULT.cuda_context_gib + DEFAULT.nccl_communicator_gib * (groups - 1)
        assert usable(*flags) == pytest.approx(device - reserved, rel=1e-9), flags


def test_a_locked_sm_clock_slows_compute_only_where_it_binds_before_the_power_limit():
    """A benchmark locks the SM clock (nvidia-smi -lgc): a compute-bound kernel then runs at its burst rate x clock /
    boost, capped by what the power limit sustains. On a 700 W H200 (sustained = 0.932 of the burst) 1,500 MHz
    binds: GEMMs and attention at 1500 / 1980 / 0.932 of their sustained rates, memory-bound work unchanged. A
    B200 at 1,665 MHz does not (its 1000 W sustained rate is 0.814 of the burst, below 1665 / 1965), nor does an
    H100 capped at 500 W at 1,500 MHz (the power binds first)."""
    from torchtitan.estimate import rates
    from torchtitan.estimate.report import training_report

    one = ["--model.flavor=1B", "--estimate.num_devices=1", "--training.local_batch_size=2"]
    free = estimate(*one, "--estimate.hardware=h200")
    locked = estimate(*one, "--estimate.hardware=h200", "--estimate.sm_clock_mhz=1500")
    factor = 1500 / 1980 / rates.HOPPER_ATTENTION_SUSTAINED
    assert factor == pytest.approx(0.813, abs=1e-3)
    fb, lb = free["step_time_breakdown_s"], locked["step_time_breakdown_s"]
    assert lb["optimizer"] == fb["optimizer"]  # memory-bound: the HBM clock is not the SM clock
    assert fb["compute"] < lb["compute"] < fb["compute"] / factor
    assert locked["hardware"]["sm_clock_mhz"] == 1500.0 and free["hardware"]["sm_clock_mhz"] is None
    assert "SM clock locked at 1500 MHz" in training_report(locked).splitlines()[1]
    for hw, clock in (
        ("b200", 1665),
        ("h200", 1940),
    ):  # the GEMMs and attention as free; the upcasts at the clock
        got = estimate(*one, f"--estimate.hardware={hw}", f"--estimate.sm_clock_mhz={clock}")[
            "compute_detail_s"
        ]
        unlocked = estimate(*one, f"--estimate.hardware={hw}")["compute_detail_s"]
        assert (got["matmul"], got["attention"]) == (unlocked["matmul"], unlocked["attention"])
        assert got["elementwise"] > unlocked["elementwise"]
    assert rates.eager_upcast_gbps("H200", 1500) == pytest.approx(
        rates.eager_upcast_gbps("H200") * 1500 / 1980
    )
    assert rates.compute_factor("H100 SXM", 500.0, 1500) == rates.power_factor("H100 SXM", 500.0)
    assert rates.compute_factor("H200", None, 1500) == pytest.approx(factor)


def test_a_model_kept_in_bf16_and_stepped_by_plain_sgd_holds_and_moves_fewer_bytes():
    """Scripts that build a Hugging Face model in bf16 and step it with torch.optim keep no fp32 copy: parameters and
    gradients 2 B each, AdamW's moments 4 B, no autocast casts; plain SGD (no momentum) keeps no state and its step
    reads each parameter and gradient and writes the parameter. The trainer's own step computes the gradient norm
    every step and scales by it only when training.max_norm > 0."""
    from torchtitan.estimate import steptime
    from torchtitan.estimate.plan import build_plan
    from torchtitan.estimate.steptime import ADAMW_BYTES_PER_PARAM, CLIP_NORM_BYTES, CLIP_SCALE_BYTES

    one = ["--model.flavor=1B", "--estimate.num_devices=1", "--training.local_batch_size=1"]
    p = estimate(*one)["model"]["params"]
    gib = 2**30
    hbm = 3350e9 * DEFAULT.hbm
    trainer = estimate(*one)
    bf16 = estimate(*one, "--estimate.model_dtype=bfloat16")
    sgd = estimate(*one, "--estimate.model_dtype=bfloat16", "--estimate.optimizer=sgd")
    no_clip = estimate(*one, "--training.max_norm=0")
    assert trainer["memory_breakdown_gib"]["parameters"] == pytest.approx(4 * p / gib)
    assert bf16["memory_breakdown_gib"]["parameters"] == pytest.approx(2 * p / gib)
    assert trainer["memory_breakdown_gib"]["optimizer_states"] == pytest.approx(8 * p / gib)
    assert bf16["memory_breakdown_gib"]["optimizer_states"] == pytest.approx(4 * p / gib)
    assert sgd["memory_breakdown_gib"]["optimizer_states"] == 0.0
    adamw = ADAMW_BYTES_PER_PARAM[parse_args([]).optimizer.implementation]
    opt = {k: r["step_time_breakdown_s"]["optimizer"] for k, r in
           dict(trainer=trainer, bf16=bf16, sgd=sgd, no_clip=no_clip).items()}  # fmt: skip
    assert opt["trainer"] == pytest.approx(p * (adamw + CLIP_NORM_BYTES + CLIP_SCALE_BYTES) / hbm)
    assert opt["no_clip"] == pytest.approx(p * (adamw + CLIP_NORM_BYTES) / hbm)
    assert opt["bf16"] == pytest.approx(opt["trainer"] / 2)
    assert opt["sgd"] == pytest.approx(p * 3 * 2 / hbm)
    # no autocast: no weight casts and a bf16 residual stream, so less compute than the trainer's autocast
    assert bf16["step_time_breakdown_s"]["compute"] < trainer["step_time_breakdown_s"]["compute"]
    # the loss on the bf16 logits as they come: 6 x 2 bytes a logit against the upcast one's 32 + 2 x 2, whose
    # upcast (2 + 4 of them) runs at the unrolled copy's rate
    hf_loss = estimate(*one, "--estimate.model_dtype=bfloat16", "--estimate.eager_loss=bf16")
    loss = [r["compute_detail_s"]["loss"] for r in (bf16, hf_loss)]
    plan = build_plan(parse_args([*H100, *one, "--estimate.model_dtype=bfloat16"]))
    logits = plan.tokens_per_pass * plan.loss_vocab  # one pass a step (batch 1, no accumulation)
    upcast = logits * steptime.upcast_extra(plan, steptime.Rates(plan), 1)
    assert upcast > 0
    assert loss[1] == pytest.approx((loss[0] - upcast) * 6 * 2 / (32 + 2 * 2))
    assert hf_loss["memory_breakdown_gib"]["logits_loss"] == pytest.approx(
        bf16["memory_breakdown_gib"]["logits_loss"] / 2
    )


def test_a_name_stating_another_memory_is_planned_only_with_its_memory_and_bandwidth():
    """Leonardo's A100s are "NVIDIA A100-SXM-64GB": the A100's peak (MFU is right), not its 80 GB or 2,039 GB/s. A
    plan by that name is refused until the memory and bandwidth are given; a 40 GB A100 has its own entry, and a
    GH200's name states its CPU's LPDDR5X, not checked."""
    from torchtitan.errors import UserError
    from torchtitan.metrics.hardware import stated_memory_gb

    stated = {
        "NVIDIA A100-SXM4-40GB": 40,
        "gh200-144gb": 144,
        "NVIDIA GH200 480GB": None,
        "NVIDIA B200": None,
    }
    assert {name: stated_memory_gb(name) for name in stated} == stated
    with pytest.raises(UserError, match="states 64 GB.*estimate.memory_gib.*hbm_bandwidth_gbps"):
        resolve_hardware(parse_args(["--estimate.hardware=NVIDIA A100-SXM-64GB"]).estimate)
    given = ["--estimate.memory_gib=63.4", "--estimate.hbm_bandwidth_gbps=1640"]
    hw = resolve_hardware(parse_args(["--estimate.hardware=NVIDIA A100-SXM-64GB", *given]).estimate)
    assert (hw.name, hw.memory_gib, hw.hbm_gbps) == ("A100", 63.4, 1640)
    for name, key in (("NVIDIA A100-SXM4-40GB", "A100 40GB"), ("NVIDIA H100 80GB HBM3", "H100 SXM")):
        assert resolve_hardware(parse_args([f"--estimate.hardware={name}"]).estimate).name == key
    assert (
        resolve_hardware(parse_args(["--estimate.hardware=NVIDIA GH200 120GB"]).estimate).memory_gib == 96.0
    )


def test_every_hardware_field_is_overridable():
    cfg = parse_args(["--estimate.hardware=h100-sxm", "--estimate.peak_tflops=800", "--estimate.memory_gib=89.4",
                      "--estimate.hbm_bandwidth_gbps=2400", "--estimate.intra_node_bandwidth_gbps=300",
                      "--estimate.inter_node_bandwidth_gbps=25", "--estimate.devices_per_node=4"])  # fmt: skip
    hw = resolve_hardware(cfg.estimate)
    assert (hw.bf16_tflops, hw.fp8_tflops, hw.memory_gib, hw.hbm_gbps) == (800, 1600, 89.4, 2400)
    assert (hw.intra_node_gbps, hw.inter_node_gbps, hw.devices_per_node) == (300, 25, 4)
    assert "overrides" in hw.source


# ---------------------------------------------------------------- the model's behaviour


def test_memory_and_time_respond_to_each_technique():
    base = estimate(*EIGHT_B, "--estimate.num_devices=8")
    more = estimate(*EIGHT_B, "--estimate.num_devices=64")
    assert more["memory_breakdown_gib"]["optimizer_states"] == pytest.approx(
        base["memory_breakdown_gib"]["optimizer_states"] / 8
    )
    full = estimate(*EIGHT_B, "--estimate.num_devices=8", "--activation_checkpoint.mode=full")
    sel = estimate(*EIGHT_B, "--estimate.num_devices=8", "--activation_checkpoint.mode=selective")
    none = base
    acts = [x["memory_breakdown_gib"]["activations"] for x in (full, sel, none)]
    assert acts == sorted(acts)  # full < selective op < none
    rec = [x["step_time_breakdown_s"]["recompute"] for x in (none, sel, full)]
    assert rec[0] == 0 < rec[1] < rec[2]
    comp = estimate(*EIGHT_B, "--estimate.num_devices=8", "--compile.enable=true")
    assert comp["memory_breakdown_gib"]["logits_loss"] < base["memory_breakdown_gib"]["logits_loss"] / 2
    assert comp["step_time_s"] < base["step_time_s"]
    tp = estimate(*EIGHT_B, "--estimate.num_devices=8", "--parallelism.tensor_parallel_degree=4")
    assert tp["step_time_breakdown_s"]["tp_comm_exposed"] > 0
    atp = estimate(*EIGHT_B, "--estimate.num_devices=8", "--parallelism.tensor_parallel_degree=4",
                   "--estimate.async_tp=true")  # fmt: skip
    assert atp["step_time_breakdown_s"]["tp_comm_exposed"] < tp["step_time_breakdown_s"]["tp_comm_exposed"]
    pp = ["--model.flavor=70B", "--training.seq_len=8192", "--training.local_batch_size=8",
          "--parallelism.pipeline_parallel_degree=4", "--parallelism.tensor_parallel_degree=8",
          "--estimate.num_devices=64"]  # fmt: skip
    one = estimate(*pp)
    inter = estimate(*pp, "--parallelism.pipeline_parallel_schedule=Interleaved1F1B",
                     "--parallelism.pipeline_parallel_stages_per_rank=2")  # fmt: skip
    zb = estimate(*pp, "--parallelism.pipeline_parallel_schedule=InterleavedZeroBubble",
                  "--parallelism.pipeline_parallel_stages_per_rank=2")  # fmt: skip
    bubbles = [x["step_time_breakdown_s"]["pipeline_bubble"] for x in (one, inter, zb)]
    assert bubbles == sorted(bubbles, reverse=True) and bubbles[2] > 0
    # bubble = (p-1)/(v m) of the busy time
    busy = one["step_time_s"] - sum(one["step_time_breakdown_s"][k] for k in
                                    ("pipeline_bubble", "optimizer", "fsdp_comm_exposed", "pp_comm_exposed"))  # fmt: skip
    assert one["step_time_breakdown_s"]["pipeline_bubble"] == pytest.approx(busy * 3 / 8)
    cp = estimate("--model.flavor=8B", "--training.seq_len=65536", "--training.local_batch_size=1",
                  "--parallelism.context_parallel_degree=2", "--estimate.num_devices=8")  # fmt: skip
    assert cp["step_time_breakdown_s"]["cp_comm_exposed"] > 0


def test_tp_without_loss_parallel_prices_the_logits_gather_and_the_full_vocabulary_loss():
    """Loss parallel off (parallel/tensor.py: the output projection's layout is Replicate): every TP rank gathers
    the logits, re-lays them onto the vocabulary dimension and takes the loss over the whole vocabulary."""
    from torchtitan.estimate.plan import build_plan
    from torchtitan.estimate.steptime import Rates, _logits_gather, head_pass

    tp4 = [*EIGHT_B, "--estimate.num_devices=8", "--parallelism.tensor_parallel_degree=4"]
    on, off = (
        build_plan(parse_args([*H100, *tp4, f"--parallelism.enable_loss_parallel={v}"]))
        for v in ("true", "false")
    )
    r, tokens = Rates(on), 8192.0
    assert _logits_gather(on, r, tokens, has_head=True) == 0.0
    gather = _logits_gather(off, r, tokens, has_head=True)
    assert gather > 0 and _logits_gather(off, r, tokens, has_head=False) == 0.0
    h_on, h_off = head_pass(on, r, tokens), head_pass(off, r, tokens)
    assert h_off.loss == pytest.approx(4 * h_on.loss)  # the whole vocabulary on each of the 4 ranks
    vocab_bytes = tokens * off.args.vocab_size * off.act_bytes
    assert h_off.elementwise - h_on.elementwise == pytest.approx(2 * vocab_bytes / r.hbm)  # the re-layout
    a, b = (estimate(*tp4, f"--parallelism.enable_loss_parallel={v}") for v in ("true", "false"))
    assert b["step_time_breakdown_s"]["tp_comm_exposed"] > a["step_time_breakdown_s"]["tp_comm_exposed"]
    assert b["step_time_s"] > a["step_time_s"]
    assert b["memory_breakdown_gib"]["logits_loss"] > a["memory_breakdown_gib"]["logits_loss"]


def test_persistent_gemms_beside_a_collective_end_one_gemm_late_at_most(monkeypatch):
    """collectives.overlap_extension (pytorch/pytorch#143988: a 132-CTA matmul beside a NCCL kernel takes twice as
    long): a GEMM launched while the collective still runs R seconds ends min(R, W) late; without static persistent
    GEMMs every kernel just loses the collective's SM share."""
    from torchtitan.estimate.collectives import STATIC_PERSISTENT_GEMM_DEVICES, overlap_extension

    assert overlap_extension(0.0, 1.0, 0.1, 1.0, 0.1) == 0.0
    # share only (no GEMM structure): the old rule, max(comm - compute, share x overlap)
    assert overlap_extension(0.5, 1.0, 0.1) == pytest.approx(0.05)
    assert overlap_extension(3.0, 1.0, 0.1) == pytest.approx(2.0)
    # GEMMs only, 10 of 0.1 s beside a 1.5 s collective: the first 7 run at twice their time (1.4 s), the 8th
    # starts with 0.1 s of the collective left and ends 0.1 s late, the last two run alone: 1.8 s in all
    assert overlap_extension(1.5, 1.0, 0.1, 1.0, 0.1) == pytest.approx(0.8)
    # a collective shorter than one GEMM delays only the GEMM it meets, by its own length
    assert overlap_extension(0.05, 1.0, 0.1, 1.0, 0.1) == pytest.approx(0.05)
    # communication-bound: the pair ends with the collective
    assert overlap_extension(10.0, 1.0, 0.1, 1.0, 0.1) == pytest.approx(9.0)
    # never below the share-only cost, never above the compute doubled (or the collective's excess)
    for comm in (0.05, 0.3, 0.9, 2.5):
        for share in (0.25, 0.6, 0.9):
            ext = overlap_extension(comm, 1.0, 0.12, share, 0.02)
            assert overlap_extension(comm, 1.0, 0.12) <= ext + 1e-12
            assert ext <= max(comm - 1.0, 0.0) + 1.0 + 1e-9
    assert {"H100 SXM", "H200"} <= STATIC_PERSISTENT_GEMM_DEVICES
    assert not {"A100", "B200", "MI300X"} & STATIC_PERSISTENT_GEMM_DEVICES
    # in a training estimate: on an H100 the rule costs FSDP 8 more than the channel share alone; on an A100 nothing
    from torchtitan.estimate import collectives

    fsdp8 = [*EIGHT_B, "--estimate.num_devices=8"]
    a100 = ["--estimate.hardware=a100", *fsdp8]
    with_rule = estimate(*fsdp8), estimate_training(parse_args(a100))
    monkeypatch.setattr(collectives, "STATIC_PERSISTENT_GEMM_DEVICES", frozenset())
    share_only = estimate(*fsdp8), estimate_training(parse_args(a100))
    exposed = [
        [x["step_time_breakdown_s"]["fsdp_comm_exposed"] for x in pair] for pair in (with_rule, share_only)
    ]
    assert exposed[0][0] > exposed[1][0] > 0  # H100
    assert exposed[0][1] == exposed[1][1] > 0  # A100


def test_optimizer_step_peak_counts_the_kernels_temporaries():
    """One GPU, 8B cut to 16 layers, full AC: the peak is the optimizer step. foreach AdamW allocates an fp32 copy
    of every parameter (torch._foreach_sqrt of exp_avg_sq); the fused kernel and the for-loop keep none."""
    argv = ["--model.flavor=8B", "--model.n_layers=16", "--training.seq_len=2048", "--training.local_batch_size=1",
            "--activation_checkpoint.mode=full", "--estimate.num_devices=1"]  # fmt: skip
    out = {
        impl: estimate(*argv, f"--optimizer.implementation={impl}")
        for impl in ("fused", "foreach", "for-loop")
    }
    m = {k: v["memory_breakdown_gib"] for k, v in out.items()}
    assert m["fused"]["activations"] == 0  # the optimizer step is the peak in all three
    assert m["fused"]["gradients"] == pytest.approx(m["fused"]["parameters"])  # fp32 gradients, nothing more
    assert m["foreach"]["gradients"] == pytest.approx(2 * m["foreach"]["parameters"])
    assert m["for-loop"]["gradients"] == pytest.approx(m["fused"]["gradients"])
    assert out["foreach"]["memory_gib"] > out["fused"]["memory_gib"]


def test_sharded_gradients_sit_in_the_reduce_scatter_streams_pool():
    """On a GPU, FSDP2's sharded gradients (4 B x P_local) are in the reduce-scatter stream's cached blocks, which
    the compute stream never reuses: they count at the start of backward too. Not on CPU (no streams), not with CPU
    offload (host gradients), not without an FSDP wrapper (autograd's gradients on the compute stream)."""
    from torchtitan.estimate.memory import MASTER_BYTES, rank_params, reduce_scatter_pool_bytes
    from torchtitan.estimate.plan import build_plan

    argv = ["--model.flavor=8B", "--training.seq_len=8192", "--training.local_batch_size=1",
            "--activation_checkpoint.mode=selective"]  # fmt: skip
    plans = {n: build_plan(parse_args([*H100, *argv, f"--estimate.num_devices={n}"])) for n in (8, 128)}
    for plan in plans.values():
        p_local = rank_params(plan, 0)[1]
        assert reduce_scatter_pool_bytes(plan, p_local) == MASTER_BYTES * p_local
    g = {
        n: estimate(*argv, f"--estimate.num_devices={n}")["memory_breakdown_gib"]["gradients"]
        for n in (8, 128)
    }
    assert g[8] == pytest.approx(8.03e9 * 4 / 8 / 2**30, rel=0.01) and g[8] == pytest.approx(
        16 * g[128], rel=0.01
    )
    cpu = build_plan(
        parse_args([*argv, "--estimate.hardware=cpu", "--estimate.num_devices=8"]), require_rates=False
    )
    offload = build_plan(parse_args([*H100, *argv, "--estimate.num_devices=8",
                                     "--parallelism.fsdp_cpu_offload=true"]))  # fmt: skip
    single = build_plan(parse_args([*H100, *argv, "--estimate.num_devices=1"]))
    assert not single.fsdp_wrapped and single.autocast
    for plan in (cpu, offload, single):
        assert reduce_scatter_pool_bytes(plan, rank_params(plan, 0)[1]) == 0


def test_fsdp2_allocates_the_reduce_scatter_output_in_its_stream():
    """The fact `memory.reduce_scatter_pool_bytes` rests on, read from the installed torch: `foreach_reduce`
    allocates `reduce_output` (the sharded gradients' storage) inside `with ....stream(reduce_scatter_stream)`,
    and the larger reduce-scatter input outside it (the compute stream, pytorch/pytorch#129721)."""
    import ast
    import inspect
    import textwrap

    from torch.distributed.fsdp._fully_shard import _fsdp_collectives

    tree = ast.parse(textwrap.dedent(inspect.getsource(_fsdp_collectives.foreach_reduce)))

    def stream_of(node: ast.With) -> str | None:
        call = node.items[0].context_expr
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "stream":
            return ast.unparse(call.args[0]) if call.args else None
        return None

    def assigned(nodes) -> set[str]:
        return {t.id for n in nodes for t in getattr(n, "targets", []) if isinstance(t, ast.Name)}

    in_rs = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.With) and stream_of(node) == "reduce_scatter_stream":
            in_rs |= assigned(node.body)
    assert "reduce_output" in in_rs
    assert "reduce_scatter_input" not in in_rs
    assert "reduce_scatter_input" in assigned(tree.body[0].body)  # the function's own statements


def test_last_pipeline_stage_keeps_its_outputs_on_older_torch():
    """torch before pytorch/pytorch#165822 kept every micro-batch's last-stage output until step() returned them
    merged: m x tokens x vocab / TP x 2 B more on the last pipeline rank, nothing on the others."""
    from torchtitan.estimate.memory import rank_memory
    from torchtitan.estimate.plan import build_plan

    argv = [*H100, "--model.flavor=8B", "--training.seq_len=4096", "--training.local_batch_size=8",
            "--parallelism.pipeline_parallel_degree=4", "--parallelism.tensor_parallel_degree=2",
            "--parallelism.pipeline_parallel_microbatch_size=2", "--estimate.num_devices=16"]  # fmt: skip
    released = build_plan(parse_args(argv))
    kept = build_plan(parse_args([*argv, "--estimate.pp_outputs=kept"]))
    assert kept.n_microbatches == 4
    outputs = 4 * (2 * 4096) * (128256 / 2) * 2  # m x tokens per micro-batch x vocab / TP x bf16
    last = kept.pp - 1
    extra = rank_memory(kept, last)["logits_loss"] - rank_memory(released, last)["logits_loss"]
    assert extra == pytest.approx(outputs)
    for r in range(last):
        assert rank_memory(kept, r) == rank_memory(released, r)


def test_older_software_keeps_the_forwards_float8_weights():
    """--estimate.float8_weights=saved (torchao's Float8Linear before pytorch/pytorch#148922): every converted linear
    of a block that is not checkpointed keeps its unsharded float8 weight (1 B per parameter) until its backward;
    checkpointed blocks recast; bf16 runs and this trainer's default are untouched."""
    from torchtitan.estimate.memory import rank_memory
    from torchtitan.estimate.plan import build_plan

    base = [*H100, "--model.flavor=8B", "--training.seq_len=4096", "--training.local_batch_size=1",
            "--compile.enable=true", "--estimate.num_devices=8"]  # fmt: skip
    block = 4096 * (4096 + 1024 + 1024 + 4096) + 3 * 4096 * 14336  # wq wk wv wo w1 w2 w3 of the 8B

    def extra(*argv) -> float:
        recast, saved = (
            rank_memory(build_plan(parse_args([*base, *argv, f"--estimate.float8_weights={w}"])), 0)
            for w in ("recast", "saved")
        )
        assert {k for k in recast if recast[k] != saved[k]} <= {
            "float8_extras",
            "allocator_and_comm_overhead",
        }
        return saved["float8_extras"] - recast["float8_extras"]

    f8 = "--float8.enable=true"
    assert extra(f8, "--activation_checkpoint.mode=none") == pytest.approx(32 * block)
    every_2nd = ["--activation_checkpoint.mode=selective", "--activation_checkpoint.selective_ac_option=2"]
    assert extra(f8, *every_2nd) == pytest.approx(16 * block)
    assert extra(f8, "--activation_checkpoint.mode=full") == 0
    assert (
        extra(f8, "--activation_checkpoint.mode=selective", "--activation_checkpoint.selective_ac_option=op")
        == 0
    )
    assert extra("--activation_checkpoint.mode=none") == 0  # bf16: nothing to keep
    assert extra(f8, "--activation_checkpoint.mode=none", "--parallelism.tensor_parallel_degree=2",
                 "--estimate.num_devices=16") == pytest.approx(32 * block / 2)  # fmt: skip
    assert parse_args(base).estimate.float8_weights == "recast"


def _torch_pipeline_states(schedule: str, p: int, m: int, v: int, rank: int) -> list[tuple[int, int]]:
    """(passes held, passes past their input-gradient pass) after each op of torch's own order for this rank
    (`_calculate_single_rank_operations`, a private method: this test fails if a release renames it). A pass is held
    from its forward to its backward (or weight pass: an op counts while its pass is held); the first stage's input
    pass does nothing (torch runs its backward whole in the weight pass), so its passes count as held only."""
    from torch.distributed.pipelining import schedules
    from torch.distributed.pipelining.schedules import _ComputationType as Op

    cls = getattr(schedules, "Schedule" + schedule)
    order = object.__new__(cls)  # no stages or process group: only the attributes the order is computed from
    rounds = max(1, m // p)
    order.__dict__.update(pp_group_size=p, _n_microbatches=m, n_local_stages=v, num_stages=v * p,
                          _num_stages=v * p, number_of_rounds=rounds, microbatches_per_round=m // rounds)  # fmt: skip
    live, out = {}, []
    for a in order._calculate_single_rank_operations(rank):
        if a is None:
            continue
        key = (a.stage_index, a.microbatch_index)
        if a.computation_type == Op.FORWARD:
            live[key] = False
        elif a.computation_type == Op.BACKWARD_INPUT and a.stage_index > 0:
            live[key] = True
        out.append((len(live), sum(live.values())))
        if a.computation_type in (Op.BACKWARD_WEIGHT, Op.FULL_BACKWARD):
            del live[key]
    return out


@pytest.mark.parametrize("schedule", ["Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble"])
def test_pipeline_passes_held_follow_torchs_schedule_orders(schedule):
    """The passes a pipeline rank holds at its peak, as torch's own op order for every rank of every layout the
    trainer accepts (pp 2-8, 2-4 stages a rank, 1 .. 4 pp micro-batches): the most held at once
    (`in_flight_passes`), and under the zero-bubble schedules the largest sum over the order's moments of held
    passes weighted by their state, a pass past its input-gradient pass 1 .. 50 x a held one
    (`split_backward_moments`, which memory.rank_memory maximizes over)."""
    from torchtitan.estimate.memory import in_flight_passes, split_backward_moments
    from torchtitan.estimate.plan import build_plan

    checked = 0
    for p in (2, 3, 4, 8):
        for v in (2,) if schedule == "ZBVZeroBubble" else (2, 3, 4):
            for m in range(1, 4 * p + 1):
                args = [*H100, "--job.config_file=train_configs/debug_model.toml", f"--estimate.num_devices={p}",
                        "--parallelism.data_parallel_shard_degree=1", f"--model.n_layers={p * v}",
                        f"--parallelism.pipeline_parallel_degree={p}", f"--training.local_batch_size={m}",
                        f"--parallelism.pipeline_parallel_schedule={schedule}",
                        f"--parallelism.pipeline_parallel_stages_per_rank={v}",
                        "--parallelism.pipeline_parallel_microbatch_size=1"]  # fmt: skip
                try:
                    plan = build_plan(parse_args(args), require_rates=False)
                except UserError:  # a count the trainer refuses for this schedule
                    continue
                for rank in range(p):
                    states = _torch_pipeline_states(schedule, p, m, v, rank)
                    assert in_flight_passes(plan, rank) == max(h for h, _ in states), (p, m, v, rank)
                    moments = split_backward_moments(plan, rank)
                    for w in (1, 1.5, 3, 50):
                        # weight 1 a held pass, w one past its input pass
                        want = max(h - i + w * i for h, i in states)
                        got = max(h - i + w * i for h, i in moments)
                        assert got == want, (p, m, v, rank, w, moments)
                    checked += 1
    assert checked >= 100  # layouts x ranks replayed


def test_zero_bubble_weight_pass_recomputes_checkpointed_blocks_once_per_parameter_group():
    """torch's split backward under full checkpointing, counted in matmul FLOPs on two debug blocks: the input pass
    recomputes each block once (to its last saved tensor), the weight pass once per parameter group (7 linears and 2
    norms a block), so 1 + 9 recomputes a backward; steptime.split_backward_recomputes prices that on every stage
    but the first (whose backward torch runs whole)."""
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
    from torch.utils._python_dispatch import TorchDispatchMode

    from torchtitan.estimate.plan import build_plan
    from torchtitan.estimate.steptime import Pass, split_backward_recomputes
    from torchtitan.models.llama3 import model as llama
    from torchtitan.models.llama3.args import ModelArgs
    from torchtitan.parallel.activation_checkpoint import apply_ac

    mm = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}

    class MatmulFlops(TorchDispatchMode):  # no module hooks: they break the split backward
        flops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in mm:
                a, b = args[-2:]
                self.flops += 2 * a.numel() * b.shape[-1]
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    model = apply_ac(
        llama.Transformer(ModelArgs(dim=128, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64)), "full"
    )
    blocks = torch.nn.ModuleList(model.layers.values())
    h = torch.randn(2, 32, 128, requires_grad=True)
    passes = []
    with MatmulFlops() as c:
        x = h
        for block in blocks:
            x = block(x, model.freqs_cis[:32])
    passes.append(c.flops)
    with MatmulFlops() as c:
        _, groups = stage_backward_input([x], [torch.ones_like(x)], [h], blocks.parameters())
    passes.append(c.flops)
    with MatmulFlops() as c:
        stage_backward_weight(blocks.parameters(), groups)
    passes.append(c.flops)
    forward, input_pass, weight_pass = passes
    recompute = (
        input_pass - forward
    )  # the input pass: the input gradients (a forward's worth) + one recompute
    assert 0.5 * forward < recompute < forward  # stops before w2
    per_block_groups = len(groups) // len(blocks)
    assert per_block_groups == 9
    assert weight_pass == forward + per_block_groups * recompute

    args = [*H100, "--model.flavor=8B", "--estimate.num_devices=64", "--parallelism.pipeline_parallel_degree=4",
            "--parallelism.pipeline_parallel_stages_per_rank=2", "--training.local_batch_size=16",
            "--parallelism.pipeline_parallel_microbatch_size=1", "--activation_checkpoint.mode=full"]  # fmt: skip
    blocks_of_rank = [Pass(matmul=1.0, recompute=0.5)] * 4
    for schedule, again in (("Interleaved1F1B", 1), ("InterleavedZeroBubble", 10), ("ZBVZeroBubble", 10)):
        plan = build_plan(parse_args([*args, f"--parallelism.pipeline_parallel_schedule={schedule}"]))
        first_stage = len(plan.pp_plan.stage_layers[0])  # 2 blocks
        priced = split_backward_recomputes(plan, blocks_of_rank, has_emb=True)
        assert [b.recompute for b in priced] == [0.5] * first_stage + [0.5 * again] * (4 - first_stage)
        assert [b.recompute for b in split_backward_recomputes(plan, blocks_of_rank, has_emb=False)] == [
            0.5 * again
        ] * 4


@pytest.mark.parametrize("n_blocks", [1, 2])
def test_zero_bubble_memory_of_the_input_and_weight_passes_as_measured(n_blocks):
    """What torch's split backward holds, counted with the simulated rank's tracker on fp32 debug blocks under full
    checkpointing: after the input pass, the saved activations (the blocks' inputs) plus the gradients the weight
    pass reads (`weight_pass_grads_per_token`, +-5 %); inside the weight pass, the recomputed activations of its
    per-group autograd calls piling up to WEIGHT_PASS_RECOMPUTED_PER_BLOCK x what a block saves without
    checkpointing, per block (+-10 %)."""
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    from torchtitan.estimate.activations import (
        WEIGHT_PASS_RECOMPUTED_PER_BLOCK,
        BlockShape,
        saved_per_token,
        weight_pass_grads_per_token,
    )
    from torchtitan.models.llama3 import model as llama
    from torchtitan.models.llama3.args import ModelArgs
    from torchtitan.parallel.activation_checkpoint import apply_ac
    from torchtitan.simulate import _step_tracker

    torch.manual_seed(0)
    dim, ffn, batch, seq = 256, 1024, 2, 256
    args = ModelArgs(
        dim=dim, n_layers=n_blocks, n_heads=4, n_kv_heads=2, vocab_size=64, ffn_dim=ffn, max_seq_len=seq
    )
    model = apply_ac(llama.Transformer(args), "full")
    blocks = torch.nn.ModuleList(model.layers.values())
    tracker = _step_tracker()
    tracker.track_external(blocks)

    def live() -> int:
        return next(iter(tracker._curr_mem_snap.values()))["Total"]

    with tracker:
        h = torch.randn(batch, seq, dim, requires_grad=True)
        x = h
        for block in blocks:
            x = block(x, model.freqs_cis[:seq])
        grad = torch.ones_like(x)
        before_input = live()
        _, groups = stage_backward_input([x], [grad], [h], blocks.parameters())
        del grad, x
        after_input = live()
        device = next(iter(tracker._peak_mem))
        tracker._peak_mem[device] = 0
        stage_backward_weight(blocks.parameters(), groups)
        weight_pass_peak = tracker._peak_mem[device] - after_input
    shape = BlockShape(d=dim, h=dim, kv=dim // 2, f=ffn, heads=4, tp=1, sequence_parallel=False, act_bytes=4,
                       fused_norm=False)  # fmt: skip
    tokens = batch * seq
    # before_input counted the output and its gradient (deleted since), the input pass added h.grad (one of them)
    kept = after_input - before_input + tokens * dim * 4
    assert kept == pytest.approx(n_blocks * weight_pass_grads_per_token(shape) * tokens, rel=0.05)
    per_block = weight_pass_peak / (n_blocks * saved_per_token("none", shape, False) * tokens)
    assert per_block == pytest.approx(WEIGHT_PASS_RECOMPUTED_PER_BLOCK, rel=0.1), per_block


def test_pipeline_stage_boundary_buffers():
    """torch's PipelineStage keeps m receive buffers per non-first stage (the in-flight passes' inputs are among
    them), m gradient receive buffers per non-last stage and the in-flight passes' outputs: 1F1B on 4 ranks with 8
    micro-batches of 2 x 4096 tokens, TP 2 with sequence parallel (each buffer 8192 x 4096 / 2 x 2 B)."""
    from torchtitan.estimate.memory import in_flight_by_stage, pipeline_buffer_bytes
    from torchtitan.estimate.plan import build_plan

    base = [*H100, "--model.flavor=8B", "--training.seq_len=4096", "--training.local_batch_size=16",
            "--parallelism.pipeline_parallel_degree=4", "--parallelism.tensor_parallel_degree=2",
            "--parallelism.pipeline_parallel_microbatch_size=2", "--estimate.num_devices=16"]  # fmt: skip
    plan = build_plan(parse_args(base))
    assert plan.n_microbatches == 8
    buf = 2 * 4096 * (4096 / 2) * 2
    # rank 0: 4 in flight, 8 grad buffers; ranks 1, 2: 8 - (4 - r) idle receive buffers + 8 + (4 - r); last: 8 - 1
    expected = [8 + 4, 2 * 8, 2 * 8, 8 - 1]
    assert [pipeline_buffer_bytes(plan, r) for r in range(4)] == pytest.approx([n * buf for n in expected])
    inter = build_plan(parse_args([*base, "--parallelism.pipeline_parallel_schedule=Interleaved1F1B",
                                   "--parallelism.pipeline_parallel_stages_per_rank=2"]))  # fmt: skip
    # rank 0's 11 warm-up forwards: rounds of 4 micro-batches, stage 0 then stage 4, then stage 0 again
    assert in_flight_by_stage(inter, 0) == [7.0, 4.0]
    assert pipeline_buffer_bytes(inter, 0) == pytest.approx(((8 + 7) + (8 - 4) + (8 + 4)) * buf)
    assert pipeline_buffer_bytes(build_plan(parse_args(EIGHT_B + H100)), 0) == 0.0


def test_sequence_parallel_layout_copies():
    """Sequence parallelism's collectives re-lay the stream (scripts/sp_layout_copies.py measured Inductor's copy
    kernels): every reduce-scatter copies its input, an all-gather its output only when the local batch is > 1;
    each copy reads and writes tokens x dim elements. None without TP; with async TP only the backward's two
    reduce-scatters, which its micro-pipeline pass does not fuse, copy."""
    from torchtitan.estimate.plan import build_plan
    from torchtitan.estimate.steptime import sp_layout_copy_bytes

    base = [*H100, "--model.flavor=8B", "--training.seq_len=8192", "--parallelism.tensor_parallel_degree=8",
            "--estimate.num_devices=8"]  # fmt: skip
    d, b = 4096, 2

    def copies(*argv, mode="op"):
        return sp_layout_copy_bytes(build_plan(parse_args([*base, *argv])), mode)

    # batch 4: 2 all-gathers + 2 reduce-scatters each way; op recompute redoes the 2 all-gathers
    assert copies("--training.local_batch_size=4") == (8 * d * b, 8 * d * b, 4 * d * b)
    # full recompute redoes the 2 all-gathers and the first reduce-scatter (it stops before w2's); all 4 without
    # early stop
    assert copies("--training.local_batch_size=4", mode="full") == (8 * d * b, 8 * d * b, 6 * d * b)
    whole = copies("--training.local_batch_size=4", "--estimate.ac_early_stop=false", mode="full")
    assert whole == (8 * d * b, 8 * d * b, 8 * d * b)
    # batch 1: the all-gathers' outputs are views, the reduce-scatters still copy
    assert copies("--training.local_batch_size=1") == (4 * d * b, 4 * d * b, 0)
    assert copies("--training.local_batch_size=4", "--estimate.async_tp=true") == (0, 4 * d * b, 0)
    no_tp = build_plan(parse_args([*H100, "--model.flavor=8B", "--estimate.num_devices=8"]))
    assert sp_layout_copy_bytes(no_tp, "op") == (0, 0, 0)


def test_a_tp_sharded_embedding_makes_its_gradient_at_the_whole_tables_size():
    """DTensor computes a rowwise (vocabulary-sharded) embedding's weight gradient as Partial, the whole table on
    every TP rank, and reduce-scatters it to the rank's rows (measured on a simulated 70B rank: a bf16 (128256, 8192)
    gradient). That is a third moment of the peak, at the end of backward: at 64 tokens a sequence it is the 70B TP 8
    rank's peak, reported under gradients; at 8192 tokens the start of backward stays the peak. None without TP or
    with the table replicated on every TP rank."""
    from torchtitan.estimate.memory import (
        embedding_backward_bytes,
        rank_memory,
        rank_params,
        reduce_scatter_pool_bytes,
    )
    from torchtitan.estimate.plan import build_plan

    def plan(*argv: str):
        return build_plan(parse_args([*H100, "--model.flavor=70B", "--training.local_batch_size=1",
                                      "--activation_checkpoint.mode=full", "--estimate.num_devices=256", *argv]))  # fmt: skip

    table = 128256 * 8192 * 2  # bf16
    short = plan("--training.seq_len=64", "--parallelism.tensor_parallel_degree=8")
    assert embedding_backward_bytes(short) == table + table / 8
    parts = rank_memory(short, 0)
    sharded_grads = reduce_scatter_pool_bytes(short, rank_params(short, 0)[1])
    assert parts["gradients"] == pytest.approx(sharded_grads + table + table / 8)
    assert parts["activations"] == parts["logits_loss"] == 0.0
    long = plan("--training.seq_len=8192", "--parallelism.tensor_parallel_degree=8")
    assert rank_memory(long, 0)["gradients"] == pytest.approx(
        reduce_scatter_pool_bytes(long, rank_params(long, 0)[1])
    )
    assert embedding_backward_bytes(plan("--training.seq_len=64")) == 0.0
    replicated = plan(
        "--training.seq_len=64",
        "--parallelism.tensor_parallel_degree=8",
        "--estimate.tp_embedding=replicated",
    )
    assert embedding_backward_bytes(replicated) == 0.0
    # no_sync over micro-steps: the stage's unsharded gradients, accumulated across the passes in the reduce dtype,
    # are alive at the embedding's backward, the embedding's as its whole Partial table (measured on a simulated
    # PP first stage: an fp32 (65536, 16384) accumulator); each pass's table is no longer reduce-scattered to the
    # rank's rows
    accum = ("--training.seq_len=64", "--parallelism.tensor_parallel_degree=8", "--training.global_batch_size=128")  # fmt: skip
    synced, held = plan(*accum), plan(*accum, "--estimate.dp_grad_sync=step")
    assert held.unsharded_grad_passes == 4 and synced.unsharded_grad_passes == 1
    assert held.embedding_grad_params() == 128256 * 8192 == 8 * held.embedding_params()
    assert embedding_backward_bytes(held) == table
    held_parts, synced_parts = rank_memory(held, 0), rank_memory(synced, 0)
    # both at the embedding's backward
    assert held_parts["gradients"] == pytest.approx(synced_parts["gradients"] - table / 8)
    whole_table = rank_params(held, 0)[0] - held.embedding_params() + held.embedding_grad_params()
    assert held_parts["fsdp_buffers"] == pytest.approx(synced_parts["fsdp_buffers"] + whole_table * 4)


def test_an_interleaved_first_rank_has_finished_its_later_chunks_at_the_embeddings_backward():
    """torch's Interleaved1F1B runs a rank's backwards in rounds of pp micro-batches per chunk, the last chunk first:
    with one round (m = pp) the later chunk has reduce-scattered its accumulated gradients and resharded its blocks
    before the first chunk's embedding backward (counted on a simulated 405B first rank, stages 0 and 8: 9.99 GiB,
    12.02 estimated before), with two rounds (m = 2 pp) both chunks hold theirs (12.08 counted, 12.03 estimated)."""
    from torchtitan.estimate.memory import (
        fp8_param_share,
        gather_bytes,
        later_chunks_done_at_embedding,
        rank_memory,
    )
    from torchtitan.estimate.plan import build_plan

    def plan(batch: int, schedule: str = "Interleaved1F1B", per_rank: int = 2):
        return build_plan(parse_args([*H100, "--model.flavor=405B", "--model.n_layers=16", "--training.seq_len=64",
                                      f"--training.local_batch_size={batch}", "--activation_checkpoint.mode=full",
                                      "--estimate.num_devices=512", "--parallelism.tensor_parallel_degree=8",
                                      "--parallelism.pipeline_parallel_degree=8",
                                      f"--parallelism.pipeline_parallel_schedule={schedule}",
                                      f"--parallelism.pipeline_parallel_stages_per_rank={per_rank}",
                                      "--parallelism.pipeline_parallel_microbatch_size=1"]))  # fmt: skip

    one_round, two_rounds = plan(8), plan(16)
    assert later_chunks_done_at_embedding(one_round) and not later_chunks_done_at_embedding(two_rounds)
    assert not later_chunks_done_at_embedding(plan(8, "1F1B", 1))
    a, b = rank_memory(one_round, 0), rank_memory(two_rounds, 0)
    table = 128256 * 16384 * 2  # the bf16 Partial table: both peak at the embedding's backward
    assert a["gradients"] == b["gradients"] >= table
    n_blocks = one_round.rank_layers()[0][0]
    later = n_blocks / 2 * one_round.block_params()
    per_param = gather_bytes(one_round, fp8_param_share(one_round)) + one_round.reduce_bytes
    assert b["fsdp_buffers"] - a["fsdp_buffers"] == pytest.approx(later * per_param)


def test_a_tp_sharded_embeddings_gradient_is_reduce_scattered_over_tp_at_the_end_of_each_backward():
    """The Partial whole-table gradient DTensor makes for a rowwise embedding (measured on simulated ranks) is
    redistributed to the rank's rows: a reduce-scatter of the whole table over the TP group after the pass's last
    op, exposed whole. Once per pass in bf16; under PP (and no_sync) once per reduction, on the fp32 accumulator,
    spread over the micro-batches. On the first stage only, and not with a replicated table or without TP."""
    from torchtitan.estimate import steptime
    from torchtitan.estimate.plan import build_plan

    def plan(*argv: str):
        return build_plan(parse_args([*H100, "--model.flavor=70B", "--training.local_batch_size=8",
                                      "--estimate.num_devices=256", "--parallelism.tensor_parallel_degree=8", *argv]))  # fmt: skip

    table = 128256 * 8192
    every_pass = plan()
    r = steptime.Rates(every_pass)
    assert steptime.tp_embedding_grad_reduce(every_pass, r, True) == steptime._ring(
        every_pass, r, table * 2, 8, 1, "reduce_scatter"
    )
    assert steptime.tp_embedding_grad_reduce(every_pass, r, False) == 0.0
    assert steptime.tp_embedding_grad_reduce(plan("--estimate.tp_embedding=replicated"), r, True) == 0.0
    pp = plan("--parallelism.pipeline_parallel_degree=4", "--parallelism.pipeline_parallel_microbatch_size=1")
    assert pp.n_microbatches == 8 and pp.accum == 1
    once = steptime._ring(pp, steptime.Rates(pp), table * 4, 8, 1, "reduce_scatter")
    assert steptime.tp_embedding_grad_reduce(pp, steptime.Rates(pp), True) == pytest.approx(once / 8)
    no_tp = build_plan(parse_args([*H100, "--model.flavor=8B", "--estimate.num_devices=8"]))
    assert steptime.tp_embedding_grad_reduce(no_tp, steptime.Rates(no_tp), True) == 0.0


def test_float8_tp_casts_once_before_the_collective():
    """Under torchao's float8 TP styles (tensorwise, TP on a GPU) the attention / feed-forward inputs and wo / w2's
    output gradients are cast once, on the sequence-sharded tensor; the Float8Linears that receive float8 skip
    that cast and only transpose it for the weight gradient. Without TP every linear casts its own."""
    from torchtitan.estimate.plan import build_plan
    from torchtitan.estimate.steptime import _float8_cast_bytes, float8_tp_shared_cast_bytes

    base = [*H100, "--model.flavor=8B", "--training.seq_len=8192", "--training.local_batch_size=2",
            "--float8.enable=true", "--compile.enable=true", "--estimate.num_devices=8"]  # fmt: skip
    tp = build_plan(parse_args([*base, "--parallelism.tensor_parallel_degree=8"]))
    lin = {x.name: x for x in tp.block_linears}
    d = 4096
    assert _float8_cast_bytes(tp, lin["wq"]) == (0.0, 2 * d + 5 * 512, 7.0)  # wq: k = 4096, n = 4096 / 8
    assert _float8_cast_bytes(tp, lin["wo"]) == (3 * 512, 3 * 512 + 2 * d, 7.0)  # wo: k = 512, n = 4096
    # the shared casts: 2 inputs forward, 2 gradients backward, on d / tp per token; op recompute redoes wk, w3
    assert float8_tp_shared_cast_bytes(tp, {"wk", "wo", "w3"}) == (6 * d / 8, 6 * d / 8, 6 * d / 8)
    no_tp = build_plan(parse_args(base))
    lin = {x.name: x for x in no_tp.block_linears}
    assert _float8_cast_bytes(no_tp, lin["wq"]) == (3 * d, 3 * d + 5 * d, 7.0)
    assert float8_tp_shared_cast_bytes(no_tp, set()) == (0, 0, 0)


def test_full_recompute_stops_before_w2_as_the_trainer_does():
    """A fully checkpointed block's recompute reruns 6 of its 7 matmuls: torch's non-reentrant checkpoint (this
    trainer's) stops once the last tensor backward saved is rebuilt, before w2 runs, which
    tests/test_activation_checkpoint.py counts on the trainer's own model; a compiled block's partitioner recomputes
    only what backward reads, so never w2 either. `--estimate.ac_early_stop=false` (reentrant checkpointing,
    torchtitan since its PR #1580) reruns the whole block, in eager blocks only."""
    from torchtitan.estimate.plan import build_plan
    from torchtitan.estimate.steptime import Rates, _linear_time, block_pass

    argv = [*H100, "--model.flavor=8B", "--training.seq_len=8192", "--training.local_batch_size=1",
            "--activation_checkpoint.mode=full", "--estimate.num_devices=8"]  # fmt: skip

    def passes(*extra):
        plan = build_plan(parse_args([*argv, *extra]))
        r = Rates(plan)
        full, none = (block_pass(plan, r, m, plan.tokens_per_pass) for m in ("full", "none"))
        w2 = next(lin for lin in plan.block_linears if lin.name == "w2")
        w2_fwd = _linear_time(r, w2, plan.tokens_per_pass, plan.tp, plan.act_bytes)[0]
        return full, none, w2_fwd

    full, none, w2_fwd = passes()
    whole, _, _ = passes("--estimate.ac_early_stop=false")
    assert none.recompute == 0 and w2_fwd > 0
    # early stop saves w2's forward, and nothing else
    assert whole.recompute - full.recompute == pytest.approx(w2_fwd, rel=1e-9)
    compile_ = ["--compile.enable=true", "--compile.components=model"]
    compiled, _, _ = passes(*compile_)
    assert passes(*compile_, "--estimate.ac_early_stop=false")[0].recompute == compiled.recompute


def test_async_tp_leaves_the_backward_reduce_scatters_exposed():
    """Async TP prices the collectives torch's micro-pipeline pass fuses by their measured exposure (forward and
    backward graph, efficiency.py); the backward's two reduce-scatters per block (of summed input gradients) it
    cannot fuse stay exposed like vanilla TP's."""
    from torchtitan.estimate.plan import build_plan
    from torchtitan.estimate.steptime import Rates, async_tp_exposed_time, async_tp_unfused, tp_comm

    argv = [*H100, "--model.flavor=8B", "--training.seq_len=8192", "--training.local_batch_size=2",
            "--parallelism.tensor_parallel_degree=8", "--estimate.num_devices=8", "--estimate.async_tp=true"]  # fmt: skip
    plan = build_plan(parse_args(argv))
    r, tokens = Rates(plan), plan.tokens_per_pass
    modes = ["op"] * 4
    total, unfused = tp_comm(plan, r, tokens, modes, False, False), async_tp_unfused(plan, r, tokens, modes)
    # per block: 2 + 2 forward, 2 + 2 backward, 2 recomputed all-gathers of equal size; 2 are unfused
    assert unfused == pytest.approx(total * 2 / 10, rel=0.05) and unfused > 0
    # forward 4 at async_tp_exposed; 2 recomputed + 2 backward all-gathers at the backward graph's figure (op SAC)
    e, one = plan.eff, total / len(modes) / 10
    per_block = 4 * e.async_tp_exposed + 4 * e.async_tp_backward_exposed + 2 * e.tp_exposed
    assert async_tp_exposed_time(plan, r, tokens, modes, False, False) == pytest.approx(
        len(modes) * per_block * one, rel=0.05
    )
    # full AC: 3 recomputed (the recompute stops before w2 and its reduce-scatter), 4 without early stop
    full = 4 * e.async_tp_exposed + 5 * e.async_tp_backward_exposed_full + 2 * e.tp_exposed
    assert async_tp_exposed_time(plan, r, tokens, ["full"], False, False) == pytest.approx(
        full * one, rel=0.05
    )
    whole = build_plan(parse_args([*argv, "--estimate.ac_early_stop=false"]))
    assert async_tp_exposed_time(whole, r, tokens, ["full"], False, False) == pytest.approx(
        full * one + e.async_tp_backward_exposed_full * one, rel=0.05
    )
    no_sp = build_plan(parse_args([*argv, "--parallelism.enable_sequence_parallel=false"]))
    assert async_tp_exposed_time(no_sp, r, tokens, modes, False, False) == pytest.approx(
        no_sp.eff.tp_exposed * tp_comm(no_sp, r, tokens, modes, False, False)
    )  # all-reduces: nothing to fuse
    out = estimate_training(parse_args(argv))
    vanilla = estimate_training(parse_args(argv[:-1]))
    assert (
        out["step_time_breakdown_s"]["tp_comm_exposed"] < vanilla["step_time_breakdown_s"]["tp_comm_exposed"]
    )


def test_ring_attention_is_priced_by_the_kernels_torch_runs():
    """Under CP, torch's load-balanced ring attention runs one causal kernel (seq / cp) and cp - 1 unmasked ones
    (seq / cp x seq / (2 cp)), each 1 / cp of the rank's attention FLOPs; without CP one causal kernel."""
    from torchtitan.estimate.plan import build_plan
    from torchtitan.estimate.steptime import Rates, block_pass, ring_attention_kernels

    assert ring_attention_kernels(1, 8192) == [(1.0, 8192, True)]
    kernels = ring_attention_kernels(4, 32768)
    assert kernels == [(0.25, 32768, True), (0.75, 16384, False)]
    assert sum(share for share, _, _ in kernels) == 1.0
    plan = build_plan(parse_args([*H100, "--model.flavor=8B", "--training.seq_len=131072",
                                  "--training.local_batch_size=1", "--parallelism.context_parallel_degree=4",
                                  "--estimate.num_devices=8"]))  # fmt: skip
    r = Rates(plan)
    tokens = plan.tokens_per_pass
    flops = 4 * tokens * (plan.seq_len / 2) * plan.shape.h
    expected = sum(
        share * (flops / r.attention(n, False, causal) + 2.5 * flops / r.attention(n, True, causal))
        for share, n, causal in kernels
    )
    got = block_pass(plan, r, "none", tokens).attention
    assert got == pytest.approx(expected)
    all_causal = flops / r.attention(32768, False) + 2.5 * flops / r.attention(32768, True)
    assert got < all_causal  # unmasked FA2 sustains more than causal (370 vs 335 TFLOPS at 16K on H100)


def test_activation_formulas_per_mode():
    for tp, sp in ((1, False), (8, True)):
        s = BlockShape(
            d=4096, h=4096 // tp, kv=1024 // tp, f=14336 // tp, heads=32 // tp, tp=tp, sequence_parallel=sp
        )
        none_e, none_c = saved_per_token("none", s, False), saved_per_token("none", s, True)
        op, full = saved_per_token("op", s, False), saved_per_token("full", s, False)
        assert full < op < none_c < none_e
        assert full == s.d_s * 2
        # selective op + its recompute never needs more than keeping everything
        assert op + backward_working_set_per_token("op", s, False) <= none_e + backward_working_set_per_token(
            "none", s, False
        )
    s = BlockShape(d=4096, h=4096, kv=1024, f=14336, heads=32, tp=1, sequence_parallel=False)
    # 8B, no TP: block input + wq + wv + attention out (+ lse) + w1 + w2 outputs, bf16
    assert saved_per_token("op", s, False) == 2 * (4096 + 4096 + 1024 + 4096 + 64 + 14336 + 4096)


def test_autocast_stream_and_weight_copies():
    """One data-parallel rank (autocast, no FSDP wrapper): the residual stream is fp32 (block input saved at 4 B),
    and the bf16 weight copies autocast keeps are the linears' only: none for the embedding, none for float8
    linears, and one block's under activation checkpointing (backward recasts them)."""
    from torchtitan.estimate.memory import autocast_weight_copies, block_modes

    one = ["--model.flavor=1B", "--training.seq_len=2048", "--estimate.num_devices=1"]
    plan = build_plan(parse_args([*H100, *one]))
    assert plan.autocast and plan.shape.sb == 4
    assert saved_per_token("full", plan.shape, True) == plan.shape.d * 4
    blk = sum(lin.in_features * lin.out_features for lin in plan.block_linears) * 2
    head = plan.args.vocab_size * plan.args.dim * 2
    n = plan.args.n_layers

    def copies(p, mode="none", option="op"):
        return autocast_weight_copies(p, n, True, block_modes(mode, option, n))

    assert copies(plan) == pytest.approx(n * blk + head)  # no embedding copy
    assert copies(plan, "full") == pytest.approx(blk + head)
    assert copies(plan, "selective", "op") == pytest.approx(blk + head)
    assert copies(plan, "selective", "2") == pytest.approx((n // 2 + 1) * blk + head)
    f8 = build_plan(parse_args([*H100, *one, "--float8.enable=true"]))
    # a converted linear casts its fp32 weight straight to float8; the filter leaves the small ones (and the head) bf16
    bf16_only = sum(lin.in_features * lin.out_features for lin in f8.block_linears if not lin.float8) * 2
    assert bf16_only < blk / 4
    assert copies(f8) == pytest.approx(n * bf16_only + head)
    fsdp = build_plan(parse_args([*H100, *one[:-1], "--estimate.num_devices=8"]))
    assert not fsdp.autocast and fsdp.shape.sb == 2


@pytest.mark.slow
def test_compiled_saved_activations_match_inductor():
    """The compiled rules of saved_per_token against what Inductor's partitioner really saves for one compiled
    block of this trainer (scripts/compiled_saved.py, CPU fp32): no AC keeps every matmul's input and output
    (not w2's output), per-op AC only what the backward reads of its save list (not w2's output); with float8
    linears, the inputs backward can rebuild and recast (docs/estimate_log.md, "Compiled float8 blocks")."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from compiled_saved import saved_by_compiled_block

    dim, ffn, heads, kv_heads = 256, 512, 8, 2
    s = BlockShape(d=dim, h=dim, kv=dim * kv_heads // heads, f=ffn, heads=heads, tp=1, sequence_parallel=False,
                   act_bytes=4)  # fmt: skip
    rstd = 2  # the two norms' fp32 row statistics, one element per token each (not modelled: < 0.1 %)
    for ac in ("none", "op"):
        measured, _ = saved_by_compiled_block(ac, dim, ffn, heads, kv_heads)
        modelled = saved_per_token(ac, s, True) / 4 - dim  # fp32 elements per token, without the block input
        assert measured - (rstd if ac == "none" else 0) == pytest.approx(modelled), ac
    # float8 (torchao tensorwise), every linear converted, then wq alone of the attention group: no float8 cast is
    # kept for a group whose every linear is converted; a partly converted group keeps its input and the cast
    groups = {"attn", "wo", "ffn", "w2"}
    for skip, partial in (((), frozenset()), (("wk", "wv"), frozenset({"attn"}))):
        measured, tensors = saved_by_compiled_block(
            "none", dim, ffn, heads, kv_heads, float8=True, float8_skip=skip
        )
        f8 = BlockShape(d=dim, h=dim, kv=dim * kv_heads // heads, f=ffn, heads=heads, tp=1, sequence_parallel=False,
                        act_bytes=4, f8_inputs=frozenset(groups - partial), f8_partial=partial)  # fmt: skip
        scales = sum(n for shape, n in tensors if shape == ()) / (2 * 128) / 4  # torchao's fp32 scalar scales
        assert measured - rstd - scales == pytest.approx(saved_per_token("none", f8, True) / 4 - dim), skip


def test_eager_rms_norm_is_priced_at_torchs_measured_kernels():
    """rates.eager_rms_norm_fraction: torch's fused eager RMSNorm as cudnn-frontend timed it (H200, GB200, GB300 at
    the Llama 3 8B / 70B / 405B widths), each part at its measured sibling's fraction of the datasheet bandwidth;
    steptime.eager_norm_extra adds the time its bytes take beyond the elementwise rate, eager blocks only."""
    from torchtitan.estimate import rates, steptime

    frac = rates.eager_rms_norm_fraction
    assert frac("H200", 4096, False) == pytest.approx(3364.5 / 4800) and frac(
        "H200", 4096, True
    ) == pytest.approx(1807.3 / 4800)
    assert frac("H100 SXM", 8192, True) == pytest.approx(1548.0 / 4800)  # the H200's fraction on the same die
    assert frac("B200", 16384, False) == pytest.approx(3799.9 / 7928)  # the GB200's
    assert frac("GB300", 2048, False) == frac("GB300", 4096, False)  # constant outside the measured widths
    assert frac("GB200", 65536, True) == frac("GB200", 16384, True)
    assert 2036.5 / 7928 < frac("GB200", 11585, True) < 2269.5 / 7928  # log2-interpolated between them
    assert frac("A100", 4096, False) is None and frac("MI300X", 4096, True) is None

    def extra(*argv: str) -> tuple[float, float]:
        plan = build_plan(parse_args(["--model.flavor=8B", *argv]))
        return steptime.eager_norm_extra(plan, steptime.Rates(plan))

    f, b = extra("--estimate.hardware=h200")
    hbm = 4800e9 * DEFAULT.hbm
    assert f == pytest.approx(
        2 * 4 * 4096 * (1 / (3364.5e9) - 1 / hbm)
    )  # two norms, x read and y written (bf16)
    assert b == pytest.approx(2 * 6 * 4096 * (1 / (1807.3e9) - 1 / hbm)) and b > 2 * f > 0
    # compiled blocks (Inductor's fused norms), torch's composite norm of before 2.9, a part without a measurement
    assert extra("--estimate.hardware=h200", "--compile.enable=true") == (0.0, 0.0)
    assert extra("--estimate.hardware=h200", "--estimate.eager_rms_norm=composite") == (0.0, 0.0)
    assert extra("--estimate.hardware=a100") == (0.0, 0.0)


@pytest.mark.slow
def test_compiled_elementwise_bytes_are_a_lower_bound_of_inductors_count():
    """The compiled branch of elementwise_bytes (a hand count) against the bytes Inductor's kernels of one compiled
    bf16 block read and write (scripts/compiled_elementwise_bytes.py, CPU): below them, within 40 % (+14 % with
    per-op SAC, +33 % without AC on the debug shape; the C++ backend's RoPE in fp32 and its norms' two backward
    reductions are most of it: docs/estimate_log.md, "Compiled blocks' elementwise bytes by Inductor's count")."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from compiled_elementwise_bytes import hand_count, per_token

    for ac in ("none", "op"):
        slope, _ = per_token("debugmodel", ac, seqs=(128, 256))
        inductor = slope[(False, True)] + slope[(True, True)]
        assert 1.0 < inductor / sum(hand_count("debugmodel", ac)) < 1.4, ac


def test_loss_buffers_freed_before_the_last_block_backward():
    """The fact docs/estimate_log.md ("The compiled loss and the logits") reports, on the trainer's own loss path
    (scripts/loss_buffers_lifetime.py, eager, full AC): no [tokens, vocab] tensor of the loss region is alive when
    the last block's backward starts, while the logits' gradient still is when the head's backward starts."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from loss_buffers_lifetime import measure

    moments = measure(compile_=False, vocab=4096, batch=1, seq=64)
    control = moments.pop("control: the logits' gradient arrives")
    assert any(alive and what == "logits' gradient" for what, _, _, alive in control)
    assert len(moments) == 2 and all(len(rows) == len(control) for rows in moments.values())
    for moment, rows in moments.items():
        assert not any(alive for *_, alive in rows), moment


def test_fits_flips_with_memory():
    # batch 1: at batch 2 this layout needs ~83 GiB, as torchtitan's table reports on 96 GB H100s (82.4 GiB)
    one = ["--model.flavor=8B", "--training.seq_len=8192", "--training.local_batch_size=1"]
    r = estimate(*one, "--estimate.num_devices=8", "--activation_checkpoint.mode=selective")
    assert r["fits"]
    small = estimate(*one, "--estimate.num_devices=8", "--activation_checkpoint.mode=selective",
                     f"--estimate.memory_gib={r['memory_gib'] * 0.9:.1f}")  # fmt: skip
    assert not small["fits"]


# ---------------------------------------------------------------- search


def test_search_ranks_fitting_layouts_fastest_first():
    cfg = parse_args([*H100, "--model.flavor=8B", "--training.seq_len=8192", "--estimate.num_devices=16",
                      "--training.global_batch_size=64"])  # fmt: skip
    results = search(cfg)
    assert results and all(r["fits"] for r in results)
    tps = [r["tokens_per_sec_per_device"] for r in results]
    assert tps == sorted(tps, reverse=True)
    assert all(r["tokens_per_step"] == 64 * 8192 for r in results)  # the set global batch is kept
    best = parse_args([*H100, "--model.flavor=8B", "--training.seq_len=8192", "--estimate.num_devices=16",
                       "--training.global_batch_size=64", *layout_flags(results[0]).split()])  # fmt: skip
    assert estimate_plan(build_plan(best))["tokens_per_sec_per_device"] == pytest.approx(tps[0])
    layouts = {(r["layout"]["tp"], r["layout"]["pp"], r["layout"]["dp_replicate"]) for r in results}
    assert len(layouts) > 3


def test_search_cli(capsys):
    assert estimate_main([*H100, "--model.flavor=8B", "--estimate.num_devices=8", "--estimate.search=true",
                          "--estimate.search_top=3"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "layouts fit; the 3 fastest" in out and out.count("\n  1 ") + out.count("\n  3 ") == 2
    assert "best: --parallelism.data_parallel_replicate_degree=" in out
    assert "accuracy   tokens/s/device: on" in out  # the comparable published runs of the best layout's kind
    # each shown layout: how many comparable published peaks, at their error, would make it not fit
    assert " at risk " in out.splitlines()[1] and "at risk: of the comparable published runs" in out


def test_search_json_carries_each_layouts_risk(tmp_path):
    from torchtitan.estimate.memory import outside_allocator_gib
    from torchtitan.estimate.plan import build_plan

    out = tmp_path / "s.json"
    assert estimate_main([*H100, "--model.flavor=8B", "--estimate.num_devices=8", "--estimate.search=true",
                          "--estimate.search_top=4", f"--estimate.json={out}"]) == 0  # fmt: skip
    data = json.loads(out.read_text())
    for r in data["layouts"]:
        mem = r["validation"]["memory GiB"]
        assert 0 <= mem["verdict_flipped_by"] <= mem["figures"]
        plan = build_plan(
            parse_args([*H100, "--model.flavor=8B", "--estimate.num_devices=8", *layout_flags(r).split()])
        )
        assert mem["peak_over_capacity"] == pytest.approx(
            r["memory_gib"] / (r["hardware"]["memory_gib"] - outside_allocator_gib(plan))
        )
    assert data["validation"] == data["layouts"][0]["validation"]  # the best layout's, not computed twice


# ---------------------------------------------------------------- inference


def test_int4_decode_bandwidth_is_tinygemms_measured_ratio_to_fp16():
    """decode_hbm_int4 is the bf16 decode fraction times tinygemm's bandwidth relative to the fp16 GEMV at batch 1,
    from Marlin's README plots (IST-DASLab/marlin ac6988b, A10, group 128, 72k x 18k): torch's int4 kernel at 3.02x
    the fp16 kernel's speed with the clocks locked at base, reading 4 bits + a bf16 scale and zero per 128 weights
    where fp16 reads 16 bits. That base-clock point is taken because an A100 asks each SM for more bytes per cycle
    than the A10 does at either clock (dequantization work per byte is what limits the kernel)."""
    bits_per_weight_g128 = 4 + (16 + 16) / 128
    assert DEFAULT.decode_hbm_int4 == pytest.approx(
        DEFAULT.decode_hbm_bf16 * 3.02 * bits_per_weight_g128 / 16, abs=0.005
    )
    assert DEFAULT.decode_hbm_int4 == pytest.approx(0.67)
    a100 = DEVICE_SPECS["A100"].hbm_gbps / (108 * 1.410)  # bytes per SM-cycle at the A100's boost clock
    a10_base, a10_boost = 600 / (72 * 0.885), 600 / (72 * 1.695)
    assert a10_boost < a10_base < a100


def test_int8_decode_bandwidth_is_inductors_measured_gemv_ratio():
    """decode_hbm_int8 is the bf16 decode fraction times the bandwidth of Inductor's fused int8 dequantize + GEMV
    relative to the bf16 GEMV, as PyTorch's gpt-fast microbenchmark measured them on its A100 CI runner
    (pytorch/pytorch#128002: gemv_int8 984.06 GB/s, gemv_bfloat16 1137.92 GB/s)."""
    assert DEFAULT.decode_hbm_int8 == pytest.approx(DEFAULT.decode_hbm_bf16 * 984.06 / 1137.92, abs=0.005)
    assert DEFAULT.decode_hbm_int8 == pytest.approx(0.72)
    # the quantized kernels sustain less of the bandwidth than the bf16 GEMV, int4 (more unpacking) less than int8
    assert DEFAULT.decode_hbm_bf16 > DEFAULT.decode_hbm_int8 > DEFAULT.decode_hbm_int4


def test_inference_keys_and_behaviour(tmp_path, capsys):
    out = tmp_path / "i.json"
    assert estimate_main(["--model.flavor=8B", "--estimate.mode=inference", "--estimate.hardware=a100",
                          f"--estimate.json={out}"]) == 0  # fmt: skip
    data = json.loads(out.read_text())
    assert {"prefill_ms", "decode_ms_per_token", "tokens_per_sec", "memory_gib"} <= set(data)
    assert "decode" in capsys.readouterr().out
    args, hw = get_model_args("8B"), resolve_hardware(parse_args(["--estimate.hardware=a100"]).estimate)
    r = {d: estimate_inference(args, hw, 1, 128, 256, d) for d in ("bfloat16", "int8", "int4")}
    assert (
        r["bfloat16"]["decode_ms_per_token"]
        > r["int8"]["decode_ms_per_token"]
        > r["int4"]["decode_ms_per_token"]
    )
    assert r["bfloat16"]["memory_breakdown_gib"]["weights"] > 2 * r["int4"]["memory_breakdown_gib"]["weights"]
    assert r["bfloat16"]["bandwidth_bound"]
    tp2 = estimate_inference(args, hw, 1, 128, 256, "bfloat16", tp=2)
    assert tp2["decode_ms_per_token"] < r["bfloat16"]["decode_ms_per_token"]
    big = estimate_inference(args, hw, 64, 128, 256, "bfloat16")
    assert big["memory_breakdown_gib"]["kv_cache"] == pytest.approx(
        64 * r["bfloat16"]["memory_breakdown_gib"]["kv_cache"]
    )
    assert big["tokens_per_sec"] > 10 * r["bfloat16"]["tokens_per_sec"]
    with pytest.raises(UserError, match="tensor_parallel_degree 3 must divide"):
        estimate_inference(args, hw, 1, 8, 8, "bfloat16", tp=3)


def test_calibrated_inference_measures_the_rates_generation_reads(tmp_path, capsys):
    """--estimate.calibrate in inference mode measures what generation reads -- the square-GEMM peak, the elementwise
    bandwidth, the decode step's own matmuls at the planned batch, and this trainer's decode step itself at two
    depths -- in one process, not the training plan's step (whose default batch, sequence and vocabulary a 1B model's
    loss and blocks would have to hold: on this VM that calibration was killed for memory). The decode step is the
    measured one carried to the model's depth; the error bar is the decode rows', compared across every device."""
    out = tmp_path / "i.json"
    argv = ["--model.flavor=1B", "--model.n_layers=2", "--estimate.mode=inference", "--estimate.hardware=cpu",
            "--estimate.calibrate=true", "--estimate.batch_size=2", "--estimate.prompt_len=16",
            "--estimate.gen_len=8", f"--estimate.json={out}"]  # fmt: skip
    assert estimate_main(argv) == 0
    text = capsys.readouterr().out
    assert "decode matmuls" in text and "measured on this device" in text
    data = json.loads(out.read_text())
    cal = data["calibration"]
    assert cal["matmul_peak_tflops"] > 0 and cal["hbm_gbps"] > 0 and cal["decode_gbps"] > 0
    assert cal["attention_tflops"] is None and cal["loss_ns_per_logit"] is None and not cal["probe_step_s"]
    # the probe ran the model with 1 block and with 2 (3, capped at the model's 2), in turn
    assert [d for d, _ in cal["decode_step_s"]] == [1, 2] and all(t > 0 for _, t in cal["decode_step_s"])
    assert [d for d, _ in cal["prefill_s"]] == [1, 2] and data["decode_measured"] and data["prefill_measured"]
    # the decode step and the prefill over the planned prompts: the line through the two depths at the model's 2
    # blocks, i.e. the 2-block figure, or the pair's mean where noise had the 1-block figure slower (on busy hosts,
    # when each depth was timed in one stretch: decode 97.7 ms at 1 block and 84.9 at 2 on CI, prefill 266 and 75)
    for (_, t1), (_, t2), got in (
        (*cal["decode_step_s"], "decode_ms_per_token"),
        (*cal["prefill_s"], "prefill_ms"),
    ):
        assert data[got] == pytest.approx((t2 if t2 >= t1 else (t1 + t2) / 2) * 1e3), got
    assert set(data["validation"]) == {"decode tokens/s"}
    assert data["validation"]["decode tokens/s"]["scope"] == "every device and layout"


def test_decode_step_carried_along_two_depths_or_priced_by_its_bytes():
    """A measured decode step is carried along the line through its two depths to the model's; where the probe
    cannot run (int4 has no CPU kernel here) the step is priced by its bytes at the measured matmul rate."""
    args = get_model_args("debugmodel")  # 6 blocks
    hw = resolve_hardware(Estimate(hardware="cpu", num_devices=1, peak_tflops=0.5, hbm_bandwidth_gbps=20))
    probe = [[1, 0.002], [3, 0.004], [1, 0.0022], [3, 0.0038]]  # medians 0.0021 and 0.0039: 0.9 ms a block
    r = estimate_inference(args, hw, 1, 8, 8, measured_decode_gbps=10.0, measured_decode_step=probe)
    assert r["decode_measured"] and r["decode_ms_per_token"] == pytest.approx(2.1 + 0.9 * 5)
    assert not r["prefill_measured"]  # no prefill points: the prefill is priced
    pre = estimate_inference(args, hw, 1, 8, 8, measured_prefill=[[1, 0.01], [3, 0.02]])
    assert pre["prefill_measured"] and pre["prefill_ms"] == pytest.approx(10 + 5 * 5)
    priced = estimate_inference(args, hw, 1, 8, 8, measured_decode_gbps=10.0)
    assert not priced["decode_measured"] and priced["decode_ms_per_token"] != pytest.approx(
        r["decode_ms_per_token"]
    )
    cal = calibrate_inference(args, 1, 1, 8, 8, "int4", seconds=0.05)
    assert (
        cal.decode_step_s == cal.prefill_s == []
        and "generation not probed (int4 weights have no kernel on cpu)" in "; ".join(cal.notes)
    )
    assert cal.decode_gbps > 0


def test_generation_latency_for_the_generate_benchmark():
    """The function the generation benchmark calls: same numbers as the inference estimate, the GPU named by its
    table slug or by what torch.cuda.get_device_name() reports."""
    args = get_model_args("8B")
    hw = resolve_hardware(parse_args(["--estimate.hardware=h100-sxm"]).estimate)
    full = estimate_inference(args, hw, 4, 512, 128, "int8")
    for gpu in ("h100-sxm", "NVIDIA H100 80GB HBM3", hw):
        g = generation_latency(args, gpu, batch=4, prompt_len=512, gen_len=128, weight_dtype="int8")
        assert (g.prefill_ms, g.decode_ms_per_token, g.tokens_per_sec) == (
            full["prefill_ms"], full["decode_ms_per_token"], full["tokens_per_sec"]
        )  # fmt: skip
        assert g.hardware == "H100 SXM"
    short = generation_latency(args, "h100-sxm", prompt_len=128, gen_len=16)
    long = generation_latency(args, "h100-sxm", prompt_len=32768, gen_len=16)
    assert long.decode_ms_per_token > short.decode_ms_per_token  # a longer KV cache to read per step
    assert long.prefill_ms > 100 * short.prefill_ms  # compute-bound: FLOPs grow at least linearly
    assert (
        generation_latency(args, "a100", tp=2).decode_ms_per_token
        < generation_latency(args, "a100").decode_ms_per_token
    )
    with pytest.raises(UserError, match="unknown hardware 'NVIDIA H20'"):
        generation_latency(args, "NVIDIA H20")
    with pytest.raises(UserError, match="run with --estimate.calibrate"):
        generation_latency(args, "cpu")


# ---------------------------------------------------------------- [model] shape fields


def test_flavor_with_override_equals_its_model_args():
    cfg = parse_args(["--model.flavor=8B", "--model.n_layers=16", "--model.rope_theta=10000"])
    assert model_args_from_config(cfg.model, 2048) == get_model_args("8B", n_layers=16, rope_theta=10000.0)
    # the 8B written out field by field in TOML terms is the 8B flavor
    full = parse_args(["--model.flavor=custom", "--model.dim=4096", "--model.n_layers=32", "--model.n_heads=32",
                       "--model.n_kv_heads=8", "--model.vocab_size=128256", "--model.ffn_dim_multiplier=1.3",
                       "--model.multiple_of=1024", "--model.rope_theta=500000", "--model.rope_scaling_factor=8"])  # fmt: skip
    assert model_args_from_config(full.model, 8192) == llama3_flavors["8B"]
    exact = parse_args(["--model.flavor=8B", "--model.ffn_hidden_dim=14336"])
    a = model_args_from_config(exact.model, 2048)
    assert a.ffn_hidden_dim == 14336 and a.num_params() == llama3_flavors["8B"].num_params()
    # factor 1 = no scaling; the other RoPE fields refine the flavor's scaling
    assert (
        model_args_from_config(
            parse_args(["--model.flavor=8B", "--model.rope_scaling_factor=1"]).model, 8
        ).rope_scaling
        is None
    )
    hf = parse_args(["--model.flavor=8B", "--model.rope_high_freq_factor=2"])
    assert model_args_from_config(hf.model, 8).rope_scaling.high_freq_factor == 2.0
    with pytest.raises(
        UserError, match="model.rope_low_freq_factor is set but the model has no RoPE scaling"
    ):
        model_args_from_config(parse_args(["--model.rope_low_freq_factor=2"]).model, 8)
    with pytest.raises(UserError, match="must be divisible by n_heads"):
        model_args_from_config(parse_args(["--model.flavor=8B", "--model.n_heads=33"]).model, 8)


def test_llama2_7b_in_toml_has_its_published_size():
    cfg = parse_args(["--model.flavor=custom", "--model.dim=4096", "--model.n_layers=32", "--model.n_heads=32",
                      "--model.vocab_size=32000", "--model.ffn_hidden_dim=11008", "--model.rope_theta=10000"])  # fmt: skip
    a = model_args_from_config(cfg.model, 4096)
    assert a.n_kv_heads == 32 and a.num_params() == 6_738_415_616  # Llama 2 7B


def test_model_described_in_toml_trains_a_step(tmp_path):
    toml = tmp_path / "custom.toml"
    toml.write_text(
        (ROOT / "train_configs" / "debug_model.toml")
        .read_text()
        .replace(
            'flavor = "debugmodel"',
            'flavor = "custom"\ndim = 128\nn_layers = 2\nn_heads = 4\nn_kv_heads = 2\nffn_hidden_dim = 320\n'
            "vocab_size = 2048\nrope_theta = 10000.0\nnorm_eps = 1e-6\ntie_embeddings = true",
        )
    )
    args = [f"--job.config_file={toml}", *TINY[1:], "--training.steps=2", f"--job.dump_folder={tmp_path / 'out'}",
            "--metrics.enable_tensorboard=false"]  # fmt: skip
    r = run_train(1, args, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    log = r.stdout + r.stderr
    a = model_args_from_config(parse_args([f"--job.config_file={toml}"]).model, 64)
    assert f"model llama3 custom: {a.num_params():,} parameters" in log
    rows = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 2 and math.isfinite(rows[-1]["loss/global_avg"])


# ---------------------------------------------------------------- calibration


def test_calibration_micro_benchmarks_are_positive():
    from torchtitan.estimate import calibrate as cal

    cfg = parse_args(["--estimate.hardware=cpu", "--estimate.num_devices=1", "--training.seq_len=64",
                      "--training.local_batch_size=2"])  # fmt: skip
    plan = build_plan(cfg, require_rates=False)
    cpu = torch.device("cpu")
    shapes = cal.gemm_shapes(plan)
    assert (128, 256, 256) in shapes and len(shapes) >= 6  # [2 x 64 tokens, 256] x [256, 256]: wq forward
    for value in (
        cal.measure_gemm(shapes[0], cpu, torch.bfloat16, 0.01),
        cal.measure_attention(plan, cpu, torch.bfloat16, 0.01),
        cal.measure_bandwidth(cpu, torch.float32, 0.01),
        cal.measure_loss(plan, cpu, torch.bfloat16, 0.01),
    ):
        assert math.isfinite(value) and value > 0
    assert cal.measure_collectives(plan, cpu, 0.01) is None  # one process: nothing to measure
    # a calibration replaces the rates: the step time follows the measured GEMM speed
    c = Calibration(matmul_peak_tflops=0.05, attention_tflops=0.01, hbm_gbps=10.0)
    slow = Calibration(matmul_peak_tflops=0.05, attention_tflops=0.01, hbm_gbps=10.0,
                       matmul_tflops={s: 0.01 for s in shapes})  # fmt: skip
    fast = estimate_plan(build_plan(cfg, c))
    assert estimate_plan(build_plan(cfg, slow))["step_time_s"] > fast["step_time_s"]
    assert fast["mfu_percent"] == pytest.approx(
        100 * plan.args.flops_per_token(64) * fast["tokens_per_sec_per_device"] / 0.05e12
    )


def test_measured_eager_loss_prices_the_loss_term():
    """A calibration's eager-loss rate (ns per logit) replaces the bytes model of the loss in eager runs: the loss
    term is tokens x vocabulary x that rate; a compiled loss keeps the bytes model (the measurement is eager's)."""
    args = ["--estimate.hardware=cpu", "--estimate.num_devices=1", "--training.seq_len=64",
            "--training.local_batch_size=2"]  # fmt: skip
    base = dict(matmul_peak_tflops=0.05, attention_tflops=0.01, hbm_gbps=10.0)
    plan = build_plan(parse_args(args), Calibration(**base, loss_ns_per_logit=7.0))
    est = estimate_plan(plan)
    assert est["compute_detail_s"]["loss"] == pytest.approx(plan.tokens_per_pass * plan.loss_vocab * 7e-9)
    bytes_model = estimate_plan(build_plan(parse_args(args), Calibration(**base)))["compute_detail_s"]["loss"]
    assert bytes_model != pytest.approx(est["compute_detail_s"]["loss"])
    compiled = [*args, "--compile.enable=true"]
    with_rate = estimate_plan(build_plan(parse_args(compiled), Calibration(**base, loss_ns_per_logit=7.0)))
    without = estimate_plan(build_plan(parse_args(compiled), Calibration(**base)))
    assert with_rate["compute_detail_s"]["loss"] == pytest.approx(without["compute_detail_s"]["loss"])


def test_planned_block_is_the_ranks_share_and_is_timed_beside_its_kernels():
    """The calibration's block is the trainer's TransformerBlock with this rank's tensor-parallel share of every
    linear, over the planned micro-batch; it is timed in turn with its GEMMs and attention alone."""
    from torchtitan.estimate import calibrate as cal
    from torchtitan.estimate.steptime import _local

    args = ["--estimate.hardware=cpu", "--estimate.num_devices=2", "--training.seq_len=64",
            "--training.local_batch_size=2", "--parallelism.tensor_parallel_degree=2"]  # fmt: skip
    plan = build_plan(parse_args(args), require_rates=False)
    block, x, grad, _ = cal.planned_block(plan, torch.device("cpu"))
    linears = {n.rsplit(".", 1)[-1]: (m.in_features, m.out_features)
               for n, m in block.named_modules() if isinstance(m, torch.nn.Linear)}  # fmt: skip
    assert linears == {lin.name: _local(lin, 2) for lin in plan.block_linears}
    assert tuple(x.shape) == tuple(grad.shape) == (2, 64, plan.args.dim)
    t_block, t_kernels, tokens = cal.measure_block(plan, torch.device("cpu"), 0.01)
    assert tokens == 128 and t_block > 0 and t_kernels > 0
    assert plan.block_measurable
    for flag in ("--compile.enable=true", "--float8.enable=true"):
        assert not build_plan(parse_args([*args, flag]), require_rates=False).block_measurable
    # three windows of the timings are kept by their median surplus over the kernels: one slow window does not count
    windows = [(0.0229, 0.0146, 256), (0.0124, 0.0102, 256), (0.0150, 0.0103, 256)]
    assert cal.median_window(windows) == (0.0150, 0.0103, 256)
    # the same block under the trainer's TP plan, over a fake process group: DTensor's host time beside it
    assert math.isfinite(cal.tp_dispatch_s(plan, 0.01, 1))
    assert cal.tp_dispatch_s(build_plan(parse_args(args[:2]), require_rates=False), 0.01, 1) is None  # no TP
    with mock.patch("torch.multiprocessing.spawn", side_effect=RuntimeError("the probe's process died")):
        assert (
            cal.tp_dispatch_s(plan, 0.01, 1) is None
        )  # a failed probe prices nothing; the calibration goes on


def test_measured_block_and_head_price_their_own_work():
    """An eager run's block costs its GEMMs and attention plus what the calibration measured beyond them
    (block_s - block_kernels_s, per token) in place of the bytes model of its elementwise work; its head, its GEMMs
    plus head_s - head_kernels_s per token in place of the loss and norm models; compiled and float8 runs keep
    the bytes models, and tensor-parallel heads too."""
    args = ["--estimate.hardware=cpu", "--estimate.num_devices=1", "--training.seq_len=64",
            "--training.local_batch_size=2"]  # fmt: skip
    base = dict(matmul_peak_tflops=0.05, attention_tflops=0.01, hbm_gbps=10.0, collective_gbps=1.0)

    def elementwise(extra_args=(), **measured) -> float:
        plan = build_plan(parse_args([*args, *extra_args]), Calibration(**base, **measured))
        return estimate_plan(plan)["compute_detail_s"]["elementwise"]

    layers = build_plan(parse_args(args), Calibration(**base)).args.n_layers
    none = elementwise(block_s=0.3, block_kernels_s=0.3, block_tokens=64)  # nothing beyond the kernels
    more = elementwise(block_s=0.7, block_kernels_s=0.3, block_tokens=64)
    assert more - none == pytest.approx(layers * 0.4 / 64 * 128)  # 128 tokens a step
    assert none < elementwise()  # the blocks' bytes are gone; the embedding's and head's stay
    # full AC runs the block's forward share again: more than without AC, less than twice
    full = ["--activation_checkpoint.mode=full"]
    f_more = elementwise(full, block_s=0.7, block_kernels_s=0.3, block_tokens=64)
    f_none = elementwise(full, block_s=0.3, block_kernels_s=0.3, block_tokens=64)
    plan = build_plan(
        parse_args([*args, *full]), Calibration(**base, block_s=0.7, block_kernels_s=0.3, block_tokens=64)
    )
    recompute = estimate_plan(plan)["step_time_breakdown_s"]["recompute"]
    plan0 = build_plan(
        parse_args([*args, *full]), Calibration(**base, block_s=0.3, block_kernels_s=0.3, block_tokens=64)
    )
    recompute0 = estimate_plan(plan0)["step_time_breakdown_s"]["recompute"]
    assert f_more - f_none == pytest.approx(more - none)
    assert 0 < recompute - recompute0 < more - none
    for flag in ("--compile.enable=true", "--float8.enable=true"):
        assert elementwise([flag], block_s=0.7, block_kernels_s=0.3, block_tokens=64) == pytest.approx(
            elementwise([flag])
        )

    def loss(extra_args=(), **measured) -> float:
        plan = build_plan(parse_args([*args, *extra_args]), Calibration(**base, **measured))
        return estimate_plan(plan)["compute_detail_s"]["loss"]

    # tensor parallel: DTensor's measured host time per block adds to the block's own work
    tp2 = ["--estimate.num_devices=2", "--parallelism.tensor_parallel_degree=2"]
    block = dict(block_s=0.7, block_kernels_s=0.3, block_tokens=64)
    assert elementwise(tp2, **block, tp_dispatch_s=0.1) - elementwise(tp2, **block) == pytest.approx(
        layers * 0.1 / 64 * 128
    )
    assert elementwise(**block, tp_dispatch_s=0.1) == pytest.approx(more)  # without TP: not used

    head = dict(head_s=0.05, head_kernels_s=0.02, block_tokens=64)
    assert loss(**head) == pytest.approx(0.03 / 64 * 128)
    for flags in (["--compile.enable=true"], ["--float8.enable=true"], tp2):
        assert loss(flags, **head) == pytest.approx(loss(flags))


def test_cpu_collectives_priced_from_their_measured_sizes():
    """A CPU calibration's collectives measured alone at two sizes: linear in bytes through the two points, the
    per-byte part scaled by (n - 1) / n for another group size; a kind not measured keeps the bus bandwidth."""
    from torchtitan.estimate.collectives import measured_time

    pts = [["all_gather", 2, 1e6, 0.001], ["all_gather", 2, 5e6, 0.003],
           ["reduce_scatter", 2, 1e6, 0.004], ["reduce_scatter", 2, 5e6, 0.006]]  # fmt: skip
    assert measured_time(pts, "all_gather", 1e6, 2) == pytest.approx(0.001)
    assert measured_time(pts, "all_gather", 3e6, 2) == pytest.approx(0.002)
    assert measured_time(pts, "reduce_scatter", 9e6, 2) == pytest.approx(0.008)
    assert measured_time(pts, "all_gather", 5e6, 4) == pytest.approx(0.0005 + 0.0025 * 1.5)
    assert measured_time(pts, "all_reduce", 1e6, 2) is None
    # in a step: tensor parallelism's reduce-scatters cost what was measured for them
    args = ["--estimate.hardware=cpu", "--estimate.num_devices=2", "--training.seq_len=64",
            "--training.local_batch_size=2", "--parallelism.tensor_parallel_degree=2"]  # fmt: skip
    base = dict(matmul_peak_tflops=0.05, attention_tflops=0.01, hbm_gbps=10.0, collective_gbps=1.0)

    def tp(points) -> float:
        plan = build_plan(parse_args(args), Calibration(**base, collective_s=points))
        return estimate_plan(plan)["step_time_breakdown_s"]["tp_comm_exposed"]

    slow_rs = [p if p[0] != "reduce_scatter" else [*p[:3], p[3] + 0.01] for p in pts]
    assert tp(slow_rs) > tp(pts) > 0
    assert tp([]) != pytest.approx(tp(pts))


def test_calibrate_cli_on_two_cpu_processes(tmp_path):
    """--estimate.calibrate measures gloo collectives between 2 processes and the runtime's resident memory."""
    out = tmp_path / "c.json"
    r = subprocess.run(
        [sys.executable, "-m", "torchtitan.estimate", "--job.config_file=train_configs/debug_model.toml",
         "--training.seq_len=64", "--training.local_batch_size=2", "--estimate.hardware=cpu",
         "--estimate.num_devices=2", "--estimate.calibrate=true", f"--estimate.json={out}"],
        cwd=ROOT, env=train_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(out.read_text())
    cal = data["calibration"]
    assert cal["collective_gbps"] > 0 and cal["hbm_gbps"] > 0 and cal["attention_tflops"] > 0
    assert cal["loss_ns_per_logit"] > 0
    assert cal["block_s"] > 0 and cal["block_kernels_s"] > 0 and cal["block_tokens"] == 128
    assert cal["head_s"] > 0 and cal["head_kernels_s"] > 0
    assert {k for k, *_ in cal["collective_s"]} == {"all_gather", "reduce_scatter", "all_reduce"}
    assert all(w == 2 and b > 0 and t > 0 for _, w, b, t in cal["collective_s"])
    assert 0.1 < cal["runtime_rss_gib"] < 4
    assert data["hardware"]["calibrated"] and data["fits"]
    # the probe timed the trainer's step with 1 and 3 of the debug model's 6 blocks, twice each, in turn; the estimate
    # is the line through each depth's mean, at 6
    assert [d for d, _ in cal["probe_step_s"]] == [1, 3, 1, 3] and all(t > 0 for _, t in cal["probe_step_s"])
    t1 = sum(t for d, t in cal["probe_step_s"] if d == 1) / 2
    t3 = sum(t for d, t in cal["probe_step_s"] if d == 3) / 2
    assert data["step_time_s"] == pytest.approx(t1 + (t3 - t1) / 2 * 5 if t3 >= t1 else (t1 + t3) / 2)
    assert "measured_beyond_model" in data["step_time_breakdown_s"]
    # a CPU plan's error bar comes from this project's calibrated CPU rows (2 processes: data parallel)
    assert data["validation"]["step time s"]["scope"] == "CPU, data parallel"
    assert set(data["validation"]) == {"step time s", "max RSS GiB"}
    # the probe ran in the planned world (2 processes, FSDP 2): the runtime, its steps' tensors and what glibc's
    # heap kept at their peak, all measured; the same runs' peaks at both depths set the memory (their line at 6)
    assert 0 < cal["probe_tensors_gib"] < 4 and 0 <= cal["heap_retention_gib"] < 4
    assert [d for d, _ in cal["probe_rss_gib"]] == [1, 3, 1, 3] and all(
        0.1 < g < 4 for _, g in cal["probe_rss_gib"]
    )
    m1 = sum(g for d, g in cal["probe_rss_gib"] if d == 1) / 2
    m3 = sum(g for d, g in cal["probe_rss_gib"] if d == 3) / 2
    assert data["memory_gib"] == pytest.approx(m1 + (m3 - m1) / 2 * 5 if m3 >= m1 else (m1 + m3) / 2)
    assert sum(data["memory_breakdown_gib"].values()) == pytest.approx(data["memory_gib"])


_UNEVEN_RANKS = """
import sys, time
import torch, torch.distributed as dist
from torchtitan.estimate.calibrate import _median_time
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank, world_size=2)
calls, x = [0], torch.ones(4)
def fn():  # a collective; rank 1 then works 20 ms longer, so the two ranks' clocks disagree after it
    dist.all_reduce(x)
    calls[0] += 1
    if rank == 1:
        time.sleep(0.02)
for seconds in (0.05, 0.1, 0.2):
    _median_time(fn, torch.device("cpu"), seconds)
counts = [None, None]
dist.all_gather_object(counts, calls[0])
print(counts)
dist.destroy_process_group()
"""


def test_median_time_makes_every_process_call_a_collective_equally_often(tmp_path):
    """Calibration times collectives by calling them repeatedly for about `seconds`: every process must stop after
    the same call, or one waits in (or loses its peer mid-) a collective the others never enter (a CI failure:
    'Connection closed by peer' in the 2-process calibration)."""
    procs = [
        subprocess.Popen([sys.executable, "-c", _UNEVEN_RANKS, str(r), str(tmp_path / "store")], cwd=ROOT,
                         env=train_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in (0, 1)
    ]  # fmt: skip
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
    counts = json.loads(outs[0][0].strip().splitlines()[-1])
    # 3 timings, each a warm-up, a probe and at least 3 timed calls
    assert counts[0] == counts[1] and counts[0] >= 3 * (2 + 3), counts


def test_a_cpu_peak_given_by_hand_is_taken_as_sustained():
    """A CPU's peak is a measurement of this machine (no datasheet MAMF to discount it by): set by hand, without
    a calibration, the estimate runs on that peak (it raised KeyError('CPU') in the sourced-rates rework)."""
    r = estimate(
        "--estimate.hardware=cpu",
        "--estimate.peak_tflops=0.2",
        "--estimate.hbm_bandwidth_gbps=10",
        "--estimate.num_devices=1",
    )
    assert r["tokens_per_sec_per_device"] > 0
    assert r["hardware"]["bf16_tflops"] == 0.2


def test_a_layout_the_trainer_refuses_on_a_cpu_is_refused_with_its_line():
    """No estimate of a plan the trainer would not run: context parallel on a CPU stops with the trainer's own
    one-line error (session 29's held-out CP configuration), and the same plan on an H100 is estimated."""
    cp = ["--parallelism.context_parallel_degree=2", "--training.seq_len=1024", "--estimate.num_devices=2"]
    with pytest.raises(
        UserError,
        match=r"context_parallel_degree=2: context parallel needs CUDA .* set context_parallel_degree=1",
    ):
        estimate(*cp, "--estimate.hardware=cpu", "--estimate.peak_tflops=0.2", "--estimate.hbm_bandwidth_gbps=10",
                 "--estimate.intra_node_bandwidth_gbps=1")  # fmt: skip
    assert estimate(*H100, *cp)["layout"]["cp"] == 2


def test_the_loss_stays_eager_under_loss_parallel_on_a_cpu_as_in_the_trainer():
    """The trainer leaves the loss eager under loss parallel on a CPU (parallel/compile.compiles_loss: compiled, its
    value was wrong there); the estimator prices the loss the same way: eager on a CPU plan with TP + loss parallel,
    compiled without loss parallel and on a GPU."""
    base = ["--compile.enable=true", "--parallelism.tensor_parallel_degree=2", "--estimate.num_devices=2"]
    cpu = ["--estimate.hardware=cpu", "--estimate.peak_tflops=0.2", "--estimate.hbm_bandwidth_gbps=10",
           "--estimate.intra_node_bandwidth_gbps=1"]  # fmt: skip
    assert not build_plan(parse_args([*base, *cpu])).compile_loss
    assert build_plan(parse_args([*base, *cpu, "--parallelism.enable_loss_parallel=false"])).compile_loss
    assert build_plan(parse_args([*H100, *base])).compile_loss


def test_float8_tensorwise_tp_all_gathers_are_priced_at_one_byte():
    """torchao's float8 TP styles (the trainer's TP plan for tensorwise Float8Linear blocks on GPUs) all-gather
    float8: the four sequence-parallel all-gathers of a block at 1 byte per element, the reduce-scatters at 2;
    rowwise, a skipped consumer, or CPU (gloo: plain styles) keep bf16. TP time shrinks accordingly."""
    from torchtitan.estimate.steptime import Rates, sp_all_gather_bytes, tp_comm

    seventy = ["--model.flavor=70B", "--training.seq_len=8192", "--training.local_batch_size=1"]
    base = [*H100, *seventy, "--estimate.num_devices=256", "--parallelism.tensor_parallel_degree=8"]
    f8 = ["--float8.enable=true"]

    def plan(*extra):
        return build_plan(parse_args([*base, *extra]))

    assert sp_all_gather_bytes(plan(*f8)) == (1, 1, 1, 1)
    assert sp_all_gather_bytes(plan(*f8, "--float8.recipe=rowwise")) == (2, 2, 2, 2)
    assert sp_all_gather_bytes(plan()) == (2, 2, 2, 2)
    # 70B: wk/wv are 8192 x 1024; with min_dim 2048 they stay bf16, so attention's input all-gather does too
    assert sp_all_gather_bytes(plan(*f8, "--float8.min_dim=2048")) == (2, 1, 1, 1)
    cpu_args = [
        *TINY,
        "--estimate.hardware=cpu",
        "--estimate.num_devices=2",
        "--parallelism.tensor_parallel_degree=2",
    ]
    cpu = build_plan(parse_args([*cpu_args, *f8, "--float8.min_dim=16"]), require_rates=False)
    assert sp_all_gather_bytes(cpu) == (cpu.act_bytes,) * 4 and cpu.hw.is_cpu

    def tp_seconds(p):
        return tp_comm(p, Rates(p), 8192.0, ["none"] * 10, False, False)

    bf16, fp8, rowwise = (
        tp_seconds(plan()),
        tp_seconds(plan(*f8)),
        tp_seconds(plan(*f8, "--float8.recipe=rowwise")),
    )
    assert (
        rowwise == pytest.approx(bf16) and 0.7 * bf16 < fp8 < 0.8 * bf16
    )  # half of 8 collectives' bytes: 3/4


def test_cpu_resident_memory_counts_measured_runtime_and_heap_retention():
    """On CPU the overhead is the measured runtime plus glibc's heap retention of the tensors; with no measured
    runtime (preflight, simulated ranks) it is nothing: the tensors alone."""
    from torchtitan.estimate.memory import rank_memory
    from torchtitan.estimate.plan import build_plan

    cfg = parse_args(["--job.config_file=train_configs/debug_model.toml", "--estimate.hardware=cpu"])
    cal = Calibration(device="cpu", matmul_peak_tflops=0.05, hbm_gbps=10.0)
    bare = rank_memory(build_plan(cfg, cal, require_rates=False), 0)
    assert bare["allocator_and_comm_overhead"] == 0.0
    cal.runtime_rss_gib = 0.5
    parts = rank_memory(build_plan(cfg, cal, require_rates=False), 0)
    tensors = sum(v for k, v in parts.items() if k != "allocator_and_comm_overhead")
    assert tensors == pytest.approx(sum(v for k, v in bare.items() if k != "allocator_and_comm_overhead"))
    assert parts["allocator_and_comm_overhead"] == pytest.approx(
        0.5 * 2**30 + DEFAULT.cpu_heap_retention * tensors
    )
    assert 0 < DEFAULT.cpu_heap_retention < 1


def test_cpu_heap_retention_measured_in_the_planned_world():
    """A calibration whose probe ran in the planned world (calibrate.planned_heap_probe) prices glibc's heap
    retention as measured there -- what the heap kept at the probe's peak -- plus the ratio for the tensors the plan
    holds beyond the probe's; without that measurement, the ratio of all the tensors."""
    from torchtitan.estimate.memory import rank_memory
    from torchtitan.estimate.plan import build_plan

    cfg = parse_args(["--job.config_file=train_configs/debug_model.toml", "--estimate.hardware=cpu"])
    cal = Calibration(device="cpu", matmul_peak_tflops=0.05, hbm_gbps=10.0, runtime_rss_gib=0.5)
    ratio_only = rank_memory(build_plan(cfg, cal, require_rates=False), 0)
    tensors = sum(v for k, v in ratio_only.items() if k != "allocator_and_comm_overhead")
    cal.heap_retention_gib, cal.probe_tensors_gib = 0.07, 0.1
    parts = rank_memory(build_plan(cfg, cal, require_rates=False), 0)
    assert parts["allocator_and_comm_overhead"] == pytest.approx(
        0.5 * 2**30 + 0.07 * 2**30 + DEFAULT.cpu_heap_retention * (tensors - 0.1 * 2**30)
    )
    assert parts["allocator_and_comm_overhead"] > ratio_only["allocator_and_comm_overhead"]
    cal.probe_tensors_gib = 10.0  # a probe larger than the plan: its retention, no negative ratio term
    parts = rank_memory(build_plan(cfg, cal, require_rates=False), 0)
    assert parts["allocator_and_comm_overhead"] == pytest.approx(0.57 * 2**30)


def test_cpu_step_measured_at_two_depths_stands_for_the_plan():
    """A CPU calibration whose probe timed the trainer's own step on this plan at two depths
    (calibrate.planned_heap_probe) sets the step time: the line through the two, carried to the plan's blocks; the
    model's terms stay in the breakdown, with what the measurement holds beyond them. It stands for this plan only:
    another batch (a search's other layout), another world or a GPU estimate keep the model; one measured depth
    stands only for a plan of that depth; a depth timed more than once, the mean of its runs."""
    from torchtitan.estimate.plan import build_plan
    from torchtitan.estimate.steptime import measured_step
    from torchtitan.estimate.training import estimate_plan

    argv = [
        "--job.config_file=train_configs/debug_model.toml",
        "--estimate.hardware=cpu",
        "--estimate.num_devices=2",
    ]
    cal = Calibration(device="cpu", matmul_peak_tflops=0.05, hbm_gbps=10.0, collective_gbps=0.3)
    modelled = estimate_plan(build_plan(parse_args(argv), cal))
    assert "measured_beyond_model" not in modelled["step_time_breakdown_s"]
    cal.probe_step_s = [[3, 0.5], [1, 0.2]]
    cal.probe_key = build_plan(parse_args(argv), cal).depth_key()
    est = estimate_plan(build_plan(parse_args(argv), cal))  # the debug model: 6 blocks
    assert est["step_time_s"] == pytest.approx(0.2 + 0.15 * 5)
    breakdown = est["step_time_breakdown_s"]
    assert sum(breakdown.values()) == pytest.approx(est["step_time_s"])
    assert breakdown["measured_beyond_model"] == pytest.approx(0.95 - modelled["step_time_s"])
    assert est["tokens_per_sec_per_device"] == pytest.approx(8 * 256 / 0.95)
    # the key is the plan's shape, batch and layout without its depth: the same at 3 blocks, not at another batch
    deeper = build_plan(parse_args([*argv, "--model.n_layers=3"]), cal)
    assert measured_step(deeper) == pytest.approx(0.5)
    for other in (["--training.local_batch_size=4"], ["--estimate.num_devices=1"]):
        plan = build_plan(parse_args([*argv, *other]), cal)
        assert measured_step(plan) is None
        assert "measured_beyond_model" not in estimate_plan(plan)["step_time_breakdown_s"]
    cal.probe_step_s = [[1, 0.2]]  # the second depth failed
    assert measured_step(build_plan(parse_args(argv), cal)) is None
    one = build_plan(parse_args([*argv, "--model.n_layers=1"]), cal)
    cal.probe_key = one.depth_key()
    assert measured_step(one) == pytest.approx(0.2)
    # a noisy pair that falls with depth is one level, at the pair's mean: at the plan's 6 blocks and at a measured 3
    cal.probe_step_s = [[1, 0.2], [3, 0.18]]
    assert measured_step(build_plan(parse_args(argv), cal)) == pytest.approx(0.19)
    assert measured_step(deeper) == pytest.approx(0.19)
    # a depth timed twice takes the mean of its runs (the trainer's typical step, slow periods included)
    cal.probe_step_s = [[1, 0.2], [3, 0.7], [1, 0.3], [3, 0.5]]
    assert measured_step(build_plan(parse_args(argv), cal)) == pytest.approx(0.25 + 0.175 * 5)


def test_cpu_memory_measured_at_two_depths_stands_for_the_plan():
    """The same probe's runs record rank 0's peak resident memory (glibc's defaults, the trainer's regime): where
    they measured this plan at two depths, the peak is their line at the plan's blocks (each depth's runs averaged),
    the model's tensors stay in the breakdown and the rest is the overhead's, of either sign. Not for another plan,
    nor under pipeline parallelism (rank 0 holds one stage; the estimate is the worst rank's)."""
    from torchtitan.estimate.memory import measured_rss
    from torchtitan.estimate.plan import build_plan
    from torchtitan.estimate.training import estimate_plan

    argv = [
        "--job.config_file=train_configs/debug_model.toml",
        "--estimate.hardware=cpu",
        "--estimate.num_devices=2",
    ]
    cal = Calibration(device="cpu", matmul_peak_tflops=0.05, hbm_gbps=10.0, collective_gbps=0.3,
                      runtime_rss_gib=0.45, probe_tensors_gib=0.05, heap_retention_gib=0.02)  # fmt: skip
    modelled = estimate_plan(build_plan(parse_args(argv), cal))
    cal.probe_rss_gib = [[1, 0.60], [3, 0.70], [1, 0.62], [3, 0.72]]
    cal.probe_key = build_plan(parse_args(argv), cal).depth_key()
    est = estimate_plan(build_plan(parse_args(argv), cal))  # the debug model: 6 blocks
    assert est["memory_gib"] == pytest.approx(0.61 + 0.05 * 5)
    assert est["memory_gib"] != pytest.approx(modelled["memory_gib"])
    assert sum(est["memory_breakdown_gib"].values()) == pytest.approx(est["memory_gib"])
    tensors = {k: v for k, v in est["memory_breakdown_gib"].items() if k != "allocator_and_comm_overhead"}
    assert tensors == {k: v for k, v in modelled["memory_breakdown_gib"].items() if k in tensors}
    for other in (["--training.local_batch_size=4"], ["--estimate.num_devices=1"]):
        assert measured_rss(build_plan(parse_args([*argv, *other]), cal)) is None
    pp = [*argv, "--parallelism.pipeline_parallel_degree=2"]
    cal.probe_key = build_plan(parse_args(pp), cal).depth_key()
    assert measured_rss(build_plan(parse_args(pp), cal)) is None


def test_dtensor_host_time_script_prints_its_table():
    """scripts/dtensor_host_time.py (docs/estimate_log.md, "The per-step gap of 8-GPU FSDP runs") times the 8B's 291
    parameters' AdamW step and clipping, plain and as DTensors over a fake process group: three rows of two positive
    figures (the figures themselves are this machine's and not asserted)."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "dtensor_host_time.py"), "--repeats", "1"],
        capture_output=True, text=True, timeout=120, env=train_env(),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [
        line for line in out.stdout.splitlines() if line.startswith("| AdamW") or line.startswith("| clip")
    ]
    assert [r.split("|")[1].strip() for r in rows] == [
        "AdamW step (foreach)",
        "AdamW step (fused)",
        "clip_grad_norm_ (foreach)",
    ]
    for r in rows:
        assert all(float(x) > 0 for x in r.split("|")[2:4])


def test_cpu_offload_is_reported_as_not_priced(tmp_path, capsys):
    """FSDP2's CPU offload (host copies, CPU AdamW) is not in the step time or the memory model: the estimate says
    so in the JSON (`not_priced`) and the report (the step time a lower bound) instead of passing for a priced one;
    without offload there is no such entry."""
    out = tmp_path / "e.json"
    argv = ["--model.flavor=1B", "--training.seq_len=2048", "--training.local_batch_size=1",
            "--estimate.hardware=h200", "--estimate.num_devices=1", "--estimate.accuracy=false",
            f"--estimate.json={out}"]  # fmt: skip
    assert estimate_main([*argv, "--parallelism.fsdp_cpu_offload=true"]) == 0
    text = capsys.readouterr().out
    got = json.loads(out.read_text())
    assert [x.split(":")[0] for x in got["not_priced"]] == ["parallelism.fsdp_cpu_offload"]
    assert "lower bound" in got["not_priced"][0] and "6,066 tokens/s" in got["not_priced"][0]
    assert "(a lower bound: see 'not priced')" in text and "not priced parallelism.fsdp_cpu_offload:" in text
    assert estimate_main(argv) == 0
    assert "not_priced" not in json.loads(out.read_text()) and "not priced" not in capsys.readouterr().out


def test_nanotron_step_costs_are_priced_by_their_bytes():
    """nanotron's three per-micro-step costs, each an option for runs of that software (docs/estimate.md): its fp32
    gradient accumulator (--estimate.grad_accumulator=fp32) adds 2 + 8 bytes a parameter after every micro-step's
    backward; its fp32 cross-entropy (--estimate.eager_loss=sharded_fp32) moves 52 bytes a logit where torch's moves
    36; SiLU and the gate product over a fused linear's strided halves (--estimate.swiglu=split) move the same bytes
    at 0.525 of the bandwidth instead of 0.80. Compiled blocks and a compiled loss keep their fused kernels."""
    from torchtitan.estimate import rates

    argv = ["--model.flavor=1B", "--estimate.hardware=h100-sxm", "--estimate.num_devices=8",
            "--parallelism.data_parallel_replicate_degree=8", "--parallelism.data_parallel_shard_degree=1",
            "--training.seq_len=4096", "--training.local_batch_size=1", "--training.global_batch_size=32",
            "--activation_checkpoint.mode=none", "--compile.enable=false", "--estimate.dp_grad_sync=step"]  # fmt: skip
    plan = build_plan(parse_args(argv))
    base = estimate_plan(plan)
    hbm = plan.hw.hbm_gbps * 1e9 * plan.eff.hbm  # 0.80 of the H100's 3,350 GB/s
    micro_steps, tokens = 4, 4096

    def delta(*extra: str) -> dict:
        got = estimate_plan(build_plan(parse_args([*argv, *extra])))
        return {k: got["compute_detail_s"][k] - base["compute_detail_s"][k] for k in base["compute_detail_s"]}

    params = plan.block_params() * plan.args.n_layers + plan.embedding_params() + plan.head_params()
    acc = delta("--estimate.grad_accumulator=fp32")
    assert acc["elementwise"] == pytest.approx(micro_steps * params * 10 / hbm, rel=1e-9)
    assert acc["matmul"] == acc["loss"] == 0
    loss = delta("--estimate.eager_loss=sharded_fp32")
    assert loss["loss"] == pytest.approx(micro_steps * tokens * plan.args.vocab_size * 16 / hbm, rel=1e-9)
    assert loss["elementwise"] == 0
    swiglu = delta("--estimate.swiglu=split")
    per_elem = (5 + 9) * 2 * (1 / (rates.STRIDED_SWIGLU_FRACTION * plan.hw.hbm_gbps * 1e9) - 1 / hbm)
    ffn = plan.args.n_layers * plan.shape.f
    assert swiglu["elementwise"] == pytest.approx(micro_steps * tokens * ffn * per_elem, rel=1e-9)
    compiled = ["--compile.enable=true", "--compile.components=model,loss"]
    base_c = estimate_plan(build_plan(parse_args([*argv, *compiled])))
    nano_c = estimate_plan(
        build_plan(
            parse_args([*argv, *compiled, "--estimate.eager_loss=sharded_fp32", "--estimate.swiglu=split"])
        )
    )
    assert nano_c["step_time_s"] == base_c["step_time_s"]


def test_ddp_no_sync_prices_one_all_reduce_per_step():
    """--estimate.dp_grad_sync=step: pure data parallelism under accumulation all-reduces once, after the last
    micro-step (DDP's no_sync, nanotron's and Megatron-LM's DDP), where this trainer reduces at every micro-step; the
    exposed all-reduce and the reduction's buffer copies count once per step. Under pipeline parallelism (which
    reduces once per schedule step already) it is a one-line error naming the key."""
    argv = ["--model.flavor=debugmodel", "--estimate.hardware=h100-sxm", "--estimate.num_devices=16",
            "--parallelism.data_parallel_replicate_degree=16", "--parallelism.data_parallel_shard_degree=1",
            "--training.local_batch_size=1", "--training.global_batch_size=64"]  # fmt: skip
    every = estimate_plan(build_plan(parse_args(argv)))
    once = estimate_plan(build_plan(parse_args([*argv, "--estimate.dp_grad_sync=step"])))
    exposed = every["step_time_breakdown_s"]["fsdp_comm_exposed"]
    assert exposed > 0
    assert once["step_time_breakdown_s"]["fsdp_comm_exposed"] == pytest.approx(exposed / 4)
    assert once["step_time_breakdown_s"]["compute"] < every["step_time_breakdown_s"]["compute"]  # copies once
    assert once["memory_gib"] == every["memory_gib"]
    replicas8 = "--parallelism.data_parallel_replicate_degree=8"
    with pytest.raises(UserError, match="dp_grad_sync.*pipeline"):
        build_plan(parse_args([*argv, "--estimate.dp_grad_sync=step", replicas8,
                               "--parallelism.pipeline_parallel_degree=2"]))  # fmt: skip


def test_fsdp_no_sync_reduces_once_and_holds_the_unsharded_gradients():
    """--estimate.dp_grad_sync=step under FSDP (FSDP2's set_requires_gradient_sync(False), FSDP1's no_sync, as other
    stacks accumulate): every micro-step still gathers, only the last reduce-scatters; until then the rank's
    unsharded gradients are kept in the reduce dtype (memory, as under PP) and each micro-step's are added into them
    (time: memory-bound, steptime.unsharded_grad_accumulation). One micro-step: nothing changes."""
    argv = ["--model.flavor=8B", "--training.seq_len=4096", "--estimate.hardware=h200",
            "--estimate.num_devices=32", "--estimate.devices_per_node=4", "--training.local_batch_size=4",
            "--activation_checkpoint.mode=full"]  # fmt: skip
    accum = [*argv, "--training.global_batch_size=512"]  # 4 micro-steps
    every = estimate_plan(build_plan(parse_args(accum)))
    once_plan = build_plan(parse_args([*accum, "--estimate.dp_grad_sync=step"]))
    assert (once_plan.reduce_rounds, once_plan.unsharded_grad_passes) == (1, 4)
    once = estimate_plan(once_plan)
    e, o = every["step_time_breakdown_s"], once["step_time_breakdown_s"]
    assert 0 < o["fsdp_comm_exposed"] < e["fsdp_comm_exposed"]
    # the unsharded gradients, 8.03B parameters in fp32 (the reduce dtype), in place of one block's gradient
    # buffers in flight (bf16 + two fp32 copies)
    held = (8.03e9 * 4 - once_plan.block_params() * (2 + 2 * 4)) / 2**30
    extra = once["memory_breakdown_gib"]["fsdp_buffers"] - every["memory_breakdown_gib"]["fsdp_buffers"]
    assert extra == pytest.approx(held, rel=0.01)
    assert once["memory_gib"] > every["memory_gib"] + 25
    # the accumulation: the first micro-step's gradients upcast (2 + 4 B), the other three added (4 + 2 read, 4
    # written), per parameter and step
    from torchtitan.estimate.steptime import Rates, unsharded_grad_accumulation

    r = Rates(once_plan)
    assert unsharded_grad_accumulation(once_plan, r, 1e9) == pytest.approx((6 + 3 * 10) * 1e9 / r.hbm)
    assert unsharded_grad_accumulation(build_plan(parse_args(accum)), r, 1e9) == 0
    one = [*argv, "--training.global_batch_size=128"]
    assert estimate_plan(build_plan(parse_args([*one, "--estimate.dp_grad_sync=step"]))) == estimate_plan(
        build_plan(parse_args(one))
    )


def test_bf16_model_under_fsdp_keeps_its_states_in_bf16():
    """--estimate.model_dtype=bfloat16 under FSDP (a model cast to bf16 before FSDP2, as KempnerForge builds it):
    the sharded parameters, gradients and AdamW moments in bf16, half the trainer's fp32 ones, the sharded
    gradients in the reduce-scatter stream's pool at 2 B a parameter; the optimizer step moves half the bytes."""
    argv = ["--model.flavor=8B", "--estimate.hardware=h100-sxm", "--estimate.num_devices=8",
            "--training.local_batch_size=1", "--activation_checkpoint.mode=full"]  # fmt: skip
    fp32 = estimate_plan(build_plan(parse_args(argv)))
    bf16 = estimate_plan(build_plan(parse_args([*argv, "--estimate.model_dtype=bfloat16"])))
    for key in ("parameters", "gradients", "optimizer_states"):
        assert bf16["memory_breakdown_gib"][key] == pytest.approx(fp32["memory_breakdown_gib"][key] / 2)
    assert bf16["step_time_breakdown_s"]["optimizer"] == pytest.approx(
        fp32["step_time_breakdown_s"]["optimizer"] / 2
    )


def test_per_linear_tp_inputs_add_the_collectives_counted_for_that_plan():
    """--estimate.tp_inputs=linear (KempnerForge's plan: each column-wise linear redistributes its own input) prices
    what 2 gloo ranks counted for a block of that plan (docs/estimate_log.md, "Per-linear TP inputs"): the backward
    reduces 5 input gradients where a module-level plan reduces 2 (reduce-scatters under sequence parallelism,
    all-reduces without), and an eager forward under sequence parallelism all-gathers 5 times (3 for the attention's
    input, 2 for the MLP's; again in the recompute), which torch.compile's CSE merges back to 2."""
    from torchtitan.estimate import steptime

    base = ["--model.flavor=8B", "--estimate.hardware=h100-sxm", "--estimate.num_devices=8",
            "--parallelism.tensor_parallel_degree=4", "--parallelism.data_parallel_shard_degree=2",
            "--training.local_batch_size=2", "--training.seq_len=4096", "--activation_checkpoint.mode=full"]  # fmt: skip

    def comm(*argv: str) -> tuple[float, float, float, float, float]:
        p = build_plan(parse_args([*base, *argv]))
        r = steptime.Rates(p)
        tokens = 2 * 4096
        one = tokens * p.args.dim * p.act_bytes
        unit = {k: steptime._ring(p, r, one, 4, 1, k) for k in ("all_gather", "reduce_scatter", "all_reduce")}
        return (*steptime.tp_block_comm(p, r, tokens, "full"), unit, p)

    for compiled in ("true", "false"):
        c = f"--compile.enable={compiled}"
        f0, rec0, b0, u, p = comm(c)
        f1, rec1, b1, _, _ = comm(c, "--estimate.tp_inputs=linear")
        assert p.sequence_parallel
        assert b1 - b0 == pytest.approx(3 * u["reduce_scatter"])
        extra_ag = 0.0 if compiled == "true" else 3 * u["all_gather"]
        assert f1 - f0 == pytest.approx(extra_ag) and rec1 - rec0 == pytest.approx(extra_ag)
    f0, rec0, b0, u, p = comm("--parallelism.enable_sequence_parallel=false")
    f1, rec1, b1, _, _ = comm("--parallelism.enable_sequence_parallel=false", "--estimate.tp_inputs=linear")
    assert not p.sequence_parallel
    assert (
        (f1, rec1) == (f0, rec0)
        and b1 - b0 == pytest.approx(3 * u["all_reduce"])
        and b0 == 2 * u["all_reduce"]
    )
    est = {
        x: estimate_plan(build_plan(parse_args([*base, f"--estimate.tp_inputs={x}"])))
        for x in ("module", "linear")
    }
    assert (
        est["linear"]["step_time_breakdown_s"]["tp_comm_exposed"]
        > est["module"]["step_time_breakdown_s"]["tp_comm_exposed"]
    )
    assert est["linear"]["memory_gib"] == est["module"]["memory_gib"]


def test_replicated_tp_head_projects_the_whole_vocabulary_on_every_tp_rank():
    """--estimate.tp_head=replicated (KempnerForge's plan on a pipeline stage, without sequence parallelism): the
    output projection is not split over the TP ranks, so each holds all of it over its FSDP shards, runs its whole
    GEMMs, and has no TP collective for it (no logits to gather, its input gradient whole on every rank); the loss
    cannot be vocabulary-parallel."""
    from torchtitan.estimate import steptime

    argv = ["--model.flavor=8B", "--estimate.hardware=h100-sxm", "--estimate.num_devices=8",
            "--parallelism.tensor_parallel_degree=4", "--parallelism.data_parallel_shard_degree=2",
            "--training.local_batch_size=2", "--training.seq_len=4096", "--parallelism.enable_sequence_parallel=false",
            "--parallelism.enable_loss_parallel=false"]  # fmt: skip
    plans = {x: build_plan(parse_args([*argv, f"--estimate.tp_head={x}"])) for x in ("sharded", "replicated")}
    vocab, dim = 128256, 4096
    assert (
        plans["replicated"].head_params() - dim == vocab * dim == 4 * (plans["sharded"].head_params() - dim)
    )
    passes = {x: steptime.head_pass(p, steptime.Rates(p), 8192) for x, p in plans.items()}
    assert passes["replicated"].matmul == pytest.approx(4 * passes["sharded"].matmul, rel=0.05)
    for x, p in plans.items():
        r = steptime.Rates(p)
        gather = steptime._logits_gather(p, r, 8192, True)
        edges = steptime._tp_edges(p, r, 8192, False, True)
        assert (gather > 0 and edges > 0) if x == "sharded" else (gather == 0.0 and edges == 0.0)
    lp = build_plan(parse_args([*argv[:-1], "--estimate.tp_head=replicated"]))
    assert lp.cfg.parallelism.enable_loss_parallel and not lp.loss_parallel and lp.loss_vocab == vocab


def test_replicated_tp_embedding_holds_the_whole_table_on_every_tp_rank():
    """--estimate.tp_embedding=replicated (KempnerForge's TP plan): the token embedding is not split over the TP
    ranks, so each holds the whole table over its FSDP shards (parameters, gradients, moments), gathers all of it,
    and the embedding has no forward TP collective (sequence parallelism slices its output), one backward
    all-gather of its output's gradient."""
    from torchtitan.estimate.memory import fsdp_shard_params

    argv = ["--model.flavor=8B", "--estimate.hardware=h100-sxm", "--estimate.num_devices=16",
            "--parallelism.tensor_parallel_degree=4", "--parallelism.data_parallel_shard_degree=4",
            "--training.local_batch_size=2", "--training.seq_len=4096"]  # fmt: skip
    plans = {
        x: build_plan(parse_args([*argv, f"--estimate.tp_embedding={x}"])) for x in ("sharded", "replicated")
    }
    table = 128256 * 4096
    assert plans["replicated"].embedding_params() == table == 4 * plans["sharded"].embedding_params()
    assert (
        fsdp_shard_params(plans["replicated"], 0) - fsdp_shard_params(plans["sharded"], 0) == 3 * table // 16
    )
    est = {x: estimate_plan(p) for x, p in plans.items()}
    b = {x: e["step_time_breakdown_s"] for x, e in est.items()}
    assert b["replicated"]["fsdp_comm_exposed"] > b["sharded"]["fsdp_comm_exposed"]
    assert b["replicated"]["tp_comm_exposed"] < b["sharded"]["tp_comm_exposed"]
    assert est["replicated"]["memory_gib"] > est["sharded"]["memory_gib"]
