"""Unit tests for the metrics building blocks: peak table and device matching, calibration, memory, sinks."""

import json
import math

import pytest
import torch

from torchtitan.errors import UserError
from torchtitan.metrics import hardware
from torchtitan.metrics.hardware import (
    DEVICE_SPECS,
    PeakFlops,
    calibrate_tflops,
    cpu_bf16_warning,
    device_spec,
    match_device,
    resolve_peak,
)
from torchtitan.metrics.memory import MemoryMonitor, device_memory_gib
from torchtitan.metrics.processor import raise_measured_peak, throughput_metrics
from torchtitan.metrics.sinks import JsonlSink, TensorBoardSink, format_line, read_tensorboard_scalars

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# ---------------------------------------------------------------- device names -> table


@pytest.mark.parametrize(
    "name, key",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 SXM5 80GB", "H100 SXM"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100-SXM4-40GB", "A100"),
        ("A100-PCIE-40GB", "A100"),  # older drivers: no vendor prefix
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA GB200", "GB200"),  # torch's name for a Grace Blackwell superchip's GPU
        ("NVIDIA B300 SXM6 AC", "B300"),  # an HGX B300 GPU as torch and nvidia-smi name it
        ("NVIDIA B300", "B300"),
        ("NVIDIA GB300", "GB300"),  # Grace Blackwell Ultra
        ("AMD Instinct MI300X", "MI300X"),
        ("AMD Instinct MI355X", "MI355X"),
        ("NVIDIA H800", "H800"),  # the SXM5 part; the PCIe card says so
        ("NVIDIA H800 80GB HBM3", "H800"),
        ("NVIDIA A800-SXM4-80GB", "A800"),
        ("AMD Instinct MI325X", "MI325X"),
        ("NVIDIA GH200 480GB", "GH200"),  # the superchip's 480 GB LPDDR5X beside its GPU's 96 GB HBM3
        ("NVIDIA GH200 120GB", "GH200"),  # 120 GB LPDDR5X (Alps, JUPITER, Isambard-AI), the same 96 GB GPU
        ("NVIDIA GH200 144G HBM3e", "GH200 144GB"),
        ("NVIDIA GH200 144GB HBM3e", "GH200 144GB"),
        ("  nvidia   h100 80gb  hbm3 ", "H100 SXM"),  # whitespace and case do not matter
    ],
)
def test_match_real_device_names(name, key):
    assert match_device(name) == key


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA RTX A1000 Laptop GPU",  # contains "A100" but is a laptop part
        "NVIDIA A10",
        "Intel A100 Accelerator",  # A100 under another vendor's name
        "NVIDIA A100-SXM4-40GB MIG 1g.5gb",  # a MIG slice has a fraction of the SMs
        "NVIDIA A100X",
        "NVIDIA H100",  # ambiguous: SXM, PCIe or NVL
        "NVIDIA H800 PCIe",  # the 2,000 GB/s PCIe card: another part
        "NVIDIA A800 80GB PCIe",
        "NVIDIA H20",  # another cut of Hopper: its own peak
        "NVIDIA GH200",  # which memory: 96 GB or 144 GB
        "NVIDIA GH200 624GB",  # not a name a driver was seen to give
        "NVIDIA L40",
        "NVIDIA GB10",  # a DGX Spark's GPU, not a GB200 / GB300
        "NVIDIA B300A",
        "NVIDIA GB300 MIG 1g.35gb",  # a MIG slice
        "AMD Instinct MI300A",
        "AMD Instinct MI350X",  # the MI355X's 1,000 W sibling: another peak
        "NVIDIA GeForce RTX 4090",
        "",
    ],
)
def test_unknown_or_lookalike_names_do_not_match(name):
    assert match_device(name) is None


def test_table_values_and_fp8():
    for key in (
        "H100 SXM",
        "H100 NVL",
        "H100 PCIe",
        "H200",
        "H200 NVL",
        "H800",
        "GH200",
        "GH200 144GB",
        "B200",
        "GB200",
        "B300",
        "GB300",
    ):
        spec = DEVICE_SPECS[key]
        assert spec.fp8_tflops == 2 * spec.bf16_tflops, key
    assert DEVICE_SPECS["A100"].fp8_tflops is None
    assert DEVICE_SPECS["L40S"].fp8_tflops == 733.0
    expected = {"A100": 312, "H100 SXM": 989, "H100 NVL": 835, "H100 PCIe": 756, "H200": 989}
    expected |= {
        "L40S": 362,
        "B200": 2250,
        "GB200": 2500,
        "B300": 2250,
        "GB300": 2500,
        "MI300X": 1307,
        "MI355X": 2516.6,
        "H800": 989,
        "A800": 312,
        "MI325X": 1307,
        "GH200": 989,
        "GH200 144GB": 989,
    }
    for key, bf16 in expected.items():
        assert DEVICE_SPECS[key].bf16_tflops == bf16
    # every canonical key is reachable from at least one real name pattern
    assert {key for _, key in hardware._NAME_PATTERNS} == set(DEVICE_SPECS)


def test_device_spec_lookup_by_slug():
    assert device_spec("h100-sxm").name == "H100 SXM"
    assert device_spec("H100 SXM").name == "H100 SXM"
    assert device_spec("NVIDIA H100 80GB HBM3").name == "H100 SXM"
    # the live table folds both A100s into one peak; the estimator plans for the memory the name says
    for name in ("NVIDIA A100-SXM4-40GB", "A100-PCIE-40GB", "NVIDIA A100 40GB PCIe"):
        assert device_spec(name).name == "A100 40GB" and match_device(name) == "A100"
    assert device_spec("NVIDIA A100-SXM4-80GB").name == "A100"
    with pytest.raises(UserError, match="h100-sxm"):
        device_spec("v100")


# ---------------------------------------------------------------- peak resolution


def test_cpu_calibration_is_positive_and_finite():
    tf = calibrate_tflops(torch.device("cpu"), torch.float32, seconds=0.05, size=256)
    assert math.isfinite(tf) and tf > 0


def test_resolve_peak_cpu_measures_and_says_so():
    peak = resolve_peak(torch.device("cpu"), torch.bfloat16, None, seconds=0.05)
    assert math.isfinite(peak.bf16_tflops) and peak.bf16_tflops > 0
    assert peak.fp8_tflops is None
    assert peak.source.startswith("measured:") and "bf16" in peak.source and "cpu" in peak.source
    assert peak.device_name


def test_a_measured_peak_is_raised_to_a_faster_achieved_rate_and_says_so():
    measured = PeakFlops(0.010, None, "measured: 1024^3 bf16 matmul calibration on cpu", "cpu")
    same, warning = raise_measured_peak(measured, 0.009, step=10)
    assert same is measured and warning is None
    raised, warning = raise_measured_peak(measured, 0.0125, step=20)
    assert raised.bf16_tflops == 0.0125 and "raised to the rate achieved by step 20" in raised.source
    assert "MFU peak raised from 0.01 to 0.0125 TFLOPS per device at step 20" in warning
    # the rank that set the new peak reads exactly 100 %, the others below
    m = throughput_metrics(1000.0, 1.0, 1, 1000.0, 12.5e6, raised)
    assert m["mfu/percent"] == 100.0
    # a datasheet or user peak is the reference as given: never moved
    for source in ("table: H100 SXM (dense bf16)", "metrics.peak_tflops override"):
        fixed = PeakFlops(989.0, 1979.0, source, "NVIDIA H100 80GB HBM3")
        assert raise_measured_peak(fixed, 1200.0, step=5) == (fixed, None)


def test_bf16_on_a_cpu_without_bf16_instructions_is_warned_about_with_torch_kernels(monkeypatch):
    monkeypatch.setattr(hardware.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    warning = cpu_bf16_warning("cpu", torch.bfloat16, fp32_kernels=False)
    assert "no AVX512-BF16, no AMX" in warning and "cpu_bf16_fp32_kernels=false" in warning
    assert cpu_bf16_warning("cpu", torch.bfloat16, fp32_kernels=True) is None  # the fast path is in use
    assert cpu_bf16_warning("cpu", torch.float32, fp32_kernels=False) is None
    assert cpu_bf16_warning("cuda", torch.bfloat16, fp32_kernels=False) is None
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert cpu_bf16_warning("cpu", torch.bfloat16, fp32_kernels=False) is None
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(hardware.platform, "machine", lambda: "aarch64")  # capability not reported: no claim
    assert cpu_bf16_warning("cpu", torch.bfloat16, fp32_kernels=False) is None


def test_override_wins(monkeypatch):
    monkeypatch.setattr(hardware, "calibrate_tflops", lambda *a, **k: pytest.fail("must not calibrate"))
    peak = resolve_peak("cpu", torch.bfloat16, 123.5)
    assert peak.bf16_tflops == 123.5 and peak.fp8_tflops is None
    assert peak.source == "metrics.peak_tflops override"
    # also over the table on a known GPU
    monkeypatch.setattr(hardware, "_device_name", lambda d: "NVIDIA H100 80GB HBM3")
    peak = resolve_peak("cuda", torch.bfloat16, 700.0, override_fp8_tflops=1400.0)
    assert (peak.bf16_tflops, peak.fp8_tflops) == (700.0, 1400.0)
    with pytest.raises(UserError, match="peak_tflops"):
        resolve_peak("cpu", torch.bfloat16, -1.0)


def test_known_cuda_device_uses_table(monkeypatch):
    # The table path never touches the device, so it runs without a GPU.
    monkeypatch.setattr(hardware, "_device_name", lambda d: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(hardware, "calibrate_tflops", lambda *a, **k: pytest.fail("must not calibrate"))
    peak = resolve_peak(torch.device("cuda"), torch.bfloat16, None)
    assert (peak.bf16_tflops, peak.fp8_tflops) == (989.0, 1978.0)
    assert peak.source == "table: H100 SXM (dense bf16)"
    assert peak.device_name == "NVIDIA H100 80GB HBM3"


def test_unknown_cuda_device_is_measured_not_guessed(monkeypatch):
    monkeypatch.setattr(hardware, "_device_name", lambda d: "NVIDIA A100-SXM4-40GB MIG 1g.5gb")
    calls = []
    monkeypatch.setattr(hardware, "calibrate_tflops", lambda d, dt, **k: calls.append(dt) or 42.0)
    peak = resolve_peak(torch.device("cuda"), torch.float8_e4m3fn, None)
    assert peak.bf16_tflops == 42.0 and peak.fp8_tflops is None  # never the A100 table value
    assert calls == [torch.bfloat16]  # an fp8 run is calibrated with bf16 matmuls
    assert peak.source.startswith("measured:") and "not in the peak table" in peak.source


@needs_cuda
def test_cuda_resolve_and_calibrate():
    dev = torch.device("cuda")
    tf = calibrate_tflops(dev, torch.bfloat16, seconds=0.2)
    assert math.isfinite(tf) and tf > 0
    peak = resolve_peak(dev, torch.bfloat16, None, seconds=0.2)
    key = match_device(torch.cuda.get_device_name(dev))
    if key is None:
        assert peak.source.startswith("measured:")
    else:
        assert peak.bf16_tflops == DEVICE_SPECS[key].bf16_tflops
        assert tf < 1.05 * peak.bf16_tflops  # a measured matmul cannot beat the datasheet peak


# ---------------------------------------------------------------- memory


def test_memory_monitor_cpu():
    mon = MemoryMonitor(torch.device("cpu"))
    big = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    snap = mon.snapshot()
    assert set(snap) == {"memory/rss_gib", "memory/max_rss_gib"}
    assert snap["memory/rss_gib"] > 0
    assert snap["memory/max_rss_gib"] >= snap["memory/rss_gib"]
    assert snap["memory/max_rss_gib"] >= 64 / 1024
    del big
    mon.reset_peak()
    assert all(math.isfinite(v) for v in mon.snapshot().values())
    assert mon.device_memory_gib() > 0 and device_memory_gib("cpu") > 0


@needs_cuda
def test_memory_monitor_cuda():
    mon = MemoryMonitor(torch.device("cuda"))
    x = torch.empty(2**30, dtype=torch.uint8, device="cuda")  # 1 GiB
    snap = mon.snapshot()
    assert snap["memory/max_active_gib"] >= 1.0
    assert snap["memory/max_reserved_gib"] >= snap["memory/max_active_gib"]
    assert 0 < snap["memory/max_active_pct"] <= 100
    assert snap["memory/max_active_pct"] == pytest.approx(100 * snap["memory/max_active_gib"] / mon.total_gib)
    assert snap["memory/ooms"] >= 0 and snap["memory/alloc_retries"] >= 0
    del x
    mon.reset_peak()
    assert mon.snapshot()["memory/max_active_gib"] < 1.0  # the peak covers the interval since the reset


# ---------------------------------------------------------------- sinks


def test_tensorboard_roundtrip(tmp_path):
    values = {s: (0.5 * s, 1000.0 + s) for s in range(1, 6)}
    with TensorBoardSink(tmp_path) as tb:
        for s, (loss, tps) in values.items():
            tb.write(s, {"loss/train": loss, "throughput/tps_per_device": tps})
        tb.write_text("run/header", "peak: table\n  indented")
    got = read_tensorboard_scalars(tmp_path)
    assert set(got) == {"loss/train", "throughput/tps_per_device"}
    assert got["loss/train"] == [(s, v[0]) for s, v in values.items()]
    assert got["throughput/tps_per_device"] == [(s, v[1]) for s, v in values.items()]


def test_tensorboard_text_is_readable(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with TensorBoardSink(tmp_path) as tb:
        tb.write_text("run/header", "line one\nline two")
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    (event,) = acc.Tensors("run/header/text_summary")
    assert event.tensor_proto.string_val[0].decode() == "    line one\n    line two"


def test_tensorboard_purge_step_drops_stale_points(tmp_path):
    with TensorBoardSink(tmp_path) as tb:  # the crashed run logged 1..10
        for s in range(1, 11):
            tb.write(s, {"loss": float(s)})
    with TensorBoardSink(tmp_path, purge_step=6) as tb:  # resumed from the step-5 checkpoint
        for s in range(6, 9):
            tb.write(s, {"loss": 100.0 + s})
    points = read_tensorboard_scalars(tmp_path)["loss"]
    steps = [s for s, _ in points]
    assert steps == list(range(1, 9))  # no duplicates, nothing stale past step 8
    assert dict(points) == {**{s: float(s) for s in range(1, 6)}, **{s: 100.0 + s for s in range(6, 9)}}


def test_read_tensorboard_missing_dir(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        read_tensorboard_scalars(tmp_path / "nope")


def test_jsonl_lines_and_non_finite(tmp_path):
    path = tmp_path / "sub" / "metrics.jsonl"
    with JsonlSink(path) as sink:
        sink.write(1, {"loss": 2.5, "memory/ooms": 0, "bad": float("nan"), "worse": float("-inf")})
        sink.write(2, {"loss": torch.tensor(1.25)})
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])  # strict JSON: no NaN/Infinity tokens
    assert "NaN" not in lines[0] and "Infinity" not in lines[0]
    assert first == {"step": 1, "loss": 2.5, "memory/ooms": 0, "bad": None, "worse": None}
    assert list(first)[0] == "step"
    assert json.loads(lines[1]) == {"step": 2, "loss": 1.25}


def test_jsonl_flushes_each_line(tmp_path):
    path = tmp_path / "m.jsonl"
    sink = JsonlSink(path)
    sink.write(3, {"loss": 1.0})
    assert json.loads(path.read_text()) == {"step": 3, "loss": 1.0}  # visible before close
    sink.close()


def test_jsonl_write_failure_drops_the_line_and_training_goes_on(tmp_path, caplog):
    """A full disk while writing metrics.jsonl: no exception, no partial line, one warning; later lines land."""
    import errno

    path = tmp_path / "m.jsonl"
    sink = JsonlSink(path)
    sink.write(1, {"loss": 1.0})
    real = sink._f

    class FullDisk:
        def write(self, data):
            real.write(data[: len(data) // 2])  # a partial write, then the error
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(real, name)

    sink._f = FullDisk()
    sink.write(2, {"loss": 2.0})
    sink.write(3, {"loss": 3.0})
    sink._f = real
    sink.write(4, {"loss": 4.0})
    sink.close()
    lines = path.read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 4]
    assert sum("cannot write" in r.message and "No space left" in r.message for r in caplog.records) == 1


def test_jsonl_resume_purges_and_repairs(tmp_path):
    path = tmp_path / "m.jsonl"
    with JsonlSink(path) as sink:
        for s in range(1, 11):
            sink.write(s, {"loss": float(s)})
    with open(path, "a") as f:
        f.write('{"step": 11, "lo')  # a crash mid-write
    with JsonlSink(path, purge_step=6) as sink:
        for s in range(6, 9):
            sink.write(s, {"loss": 100.0 + s})
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 9))
    assert records[5]["loss"] == 106.0
    # without purge_step a reopen only appends (after dropping a torn last line)
    with open(path, "a") as f:
        f.write('{"st')
    with JsonlSink(path) as sink:
        sink.write(9, {"loss": 1.0})
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == list(range(1, 10))


FIELDS = [
    ("loss", "loss", "7.4f"),
    ("grad_norm", "gnorm", "6.2f"),
    ("tps", "tps", "9,.0f"),
    ("mfu", "mfu", "6.2%"),
    ("memory/ooms", "ooms", "3d"),
]


def test_format_line_columns_align_across_steps():
    a = format_line(
        1, {"loss": 10.5, "grad_norm": 3.0, "tps": 812.0, "mfu": 0.012, "memory/ooms": 0.0}, FIELDS
    )
    b = format_line(
        12345, {"loss": 2.25, "grad_norm": 0.125, "tps": 123456.0, "mfu": 0.4567, "memory/ooms": 12}, FIELDS
    )
    assert len(a) == len(b)
    for label in ("loss ", "gnorm ", "tps ", "mfu ", "ooms "):
        assert a.index(label) == b.index(label)
    assert a.startswith("step      1  loss ")
    assert "tps   123,456" in b and "mfu 45.67%" in b and "ooms  12" in b


def test_format_line_skips_missing_and_survives_odd_values():
    line = format_line(3, {"loss": float("nan"), "tps": 5.0}, FIELDS)
    assert "gnorm" not in line and "mfu" not in line and "ooms" not in line
    assert "loss     nan" in line
    # a value the spec cannot format (float with "d") is shown anyway, padded to the spec's width
    line = format_line(3, {"memory/ooms": 1.5}, FIELDS)
    assert line.endswith("ooms 1.5")


def test_jsonl_writes_of_one_step_share_one_line(tmp_path):
    """Training metrics, then validation, at the same step: one JSON object (crash-safe: rewritten in place)."""
    path = tmp_path / "m.jsonl"
    with JsonlSink(path) as sink:
        sink.write(1, {"loss": 3.0})
        sink.write(2, {"loss": 2.0})
        sink.write(2, {"validation/loss": 2.5})
        assert [json.loads(x) for x in path.read_text().splitlines()][-1] == {
            "step": 2,
            "loss": 2.0,
            "validation/loss": 2.5,
        }
        sink.write(3, {"loss": 1.0})
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records == [
        {"step": 1, "loss": 3.0},
        {"step": 2, "loss": 2.0, "validation/loss": 2.5},
        {"step": 3, "loss": 1.0},
    ]


# ---------------------------------------------------------------- stragglers


def test_straggler_by_step_time():
    from torchtitan.metrics.processor import straggler_metrics, straggler_warning

    m = straggler_metrics([1.0, 1.02, 1.5, 0.98], [0.01, 0.01, 0.02, 0.01])
    assert m["stragglers/slowest_rank"] == 2 and m["stragglers/factor"] == pytest.approx(1.5 / 1.01)
    assert m["stragglers/median_step_s"] == pytest.approx(1.01) and m["stragglers/fastest_step_s"] == 0.98
    assert m["stragglers/slowest_step_s"] == 1.5 and m["stragglers/slowest_data_s"] == 0.02
    line = straggler_warning(m, 1.2, 11, 20)
    assert line.startswith(
        "straggler: rank 2 is 1.49x the median (metrics.straggler_factor 1.2) over steps 11-20:"
    )
    assert line.endswith("step 1.500 s vs median 1.010 s, data wait 0.020 s vs median 0.010 s")
    assert straggler_warning(m, 1.6, 11, 20) is None


def test_straggler_in_lock_step_shows_in_its_data_wait():
    """Synchronous training: everybody waits for rank 3, so the step times agree; its data wait names it."""
    from torchtitan.metrics.processor import straggler_metrics, straggler_warning

    m = straggler_metrics([0.8, 0.8, 0.8, 0.81], [0.0, 0.01, 0.0, 0.5])
    assert m["stragglers/slowest_rank"] == 3
    assert m["stragglers/factor"] == pytest.approx(1 + (0.5 - 0.005) / 0.8)
    assert straggler_warning(m, 1.2, 1, 10).startswith("straggler: rank 3 is 1.62x the median")
    even = straggler_metrics([0.5, 0.5], [0.0, 0.0])
    assert even["stragglers/factor"] == 1.0 and straggler_warning(even, 1.2, 1, 1) is None
