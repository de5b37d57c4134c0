"""`--estimate.anchor`: a training estimate scaled by a measured run of the same cluster (torchtitan/estimate/anchor.py,
docs/estimate.md "Anchoring on a measured run")."""

from __future__ import annotations

import io
import json
import re
import statistics
from pathlib import Path

import pytest

from torchtitan.config import parse_args, validate
from torchtitan.config.manager import to_toml
from torchtitan.errors import UserError
from torchtitan.estimate import anchor
from torchtitan.estimate.__main__ import main, run
from torchtitan.estimate.memory import rest_ratio, scale_peak, state_gib
from torchtitan.estimate.validation import (
    anchor_kind,
    anchored,
    cross_validated,
    device_and_layout,
    load_reference,
    training_estimate,
)

ROOT = Path(__file__).resolve().parents[1]
PLAN = [
    "--job.config_file=train_configs/llama3_8b.toml",
    "--estimate.hardware=h100-sxm",
    "--estimate.accuracy=false",
]
HEADER = (
    "[rank0] 10:00:00 INFO model llama3 8B: 8,030,261,248 parameters (7,504,924,672 in matmuls), {world} x cuda\n"
    "[rank0] 10:00:00 INFO MFU peak: 989.00 TFLOPS per device from table: {part} (dense bf16)\n"
)


def estimate(argv: list[str]) -> dict:
    cfg = parse_args(argv)
    validate(cfg)
    return run(cfg, out=io.StringIO(), argv=argv)


def run_folder(tmp_path: Path, per_device: list[float], world: int = 8, part: str | None = "H100 SXM",
               overrides: tuple[str, ...] = (), peak: float = 60.0) -> Path:  # fmt: skip
    """A run folder as the trainer writes it: the effective config, log rows of steps 1, 10, 20, ... (max reserved
    memory peak, peak + 1, ...), the header."""
    folder = tmp_path / "run"
    (folder / "logs").mkdir(parents=True)
    cfg = parse_args(["--job.config_file=train_configs/llama3_8b.toml", *overrides])
    (folder / "config.toml").write_text(to_toml(cfg))
    with open(folder / "metrics.jsonl", "w") as f:
        for i, tps in enumerate(per_device):
            f.write(json.dumps({"step": max(1, 10 * i), "throughput/tokens_per_sec_per_device": tps,
                                "throughput/tokens_per_sec_global": world * tps,
                                "memory/max_reserved_gib": peak + i}) + "\n")  # fmt: skip
    if part is not None:
        (folder / "logs" / "rank0.log").write_text(HEADER.format(world=world, part=part))
    return folder


def test_read_run_takes_the_median_after_the_warm_up_step(tmp_path):
    folder = run_folder(tmp_path, [100.0, 5000.0, 5200.0, 5100.0], world=16)
    got = anchor.read_run(str(folder))
    assert got.tokens_per_sec_per_device == 5100.0  # step 1's 100 left out
    assert (got.world_size, got.rows, got.memory_gib, got.device) == (16, 3, 63.0, "H100 SXM")


def test_read_run_of_a_real_trainer_folder(straight2):
    """The trainer's own output (2 processes on this CPU): world size from the metrics, the device from the header."""
    got = anchor.read_run(str(straight2))
    assert (got.world_size, got.device) == (2, "cpu")
    rows = [json.loads(x) for x in (straight2 / "metrics.jsonl").read_text().splitlines()]
    after = [r["throughput/tokens_per_sec_per_device"] for r in rows if r["step"] > 1]
    assert got.rows == len(after) and got.tokens_per_sec_per_device == statistics.median(after)
    assert got.memory_gib == max(r["memory/max_rss_gib"] for r in rows)


def test_an_anchor_equal_to_its_estimate_changes_nothing_and_half_halves(tmp_path):
    """Tokens/s scale by the anchor's measured / estimated; the peak beyond the training state (weights, gradients,
    optimizer states: counted, not scaled) by the anchor's own measured / estimated part beyond its state."""
    plain = estimate([*PLAN, "--estimate.num_devices=64", "--estimate.total_tokens=1e12"])
    own_run = estimate([*PLAN, "--estimate.num_devices=8"])
    own, own_state = own_run["tokens_per_sec_per_device"], state_gib(own_run)
    for factor in (1.0, 0.5):
        # the folder logs peak, peak + 1, peak + 2: its largest is the own estimate's peak with its rest x factor
        peak = own_state + (own_run["memory_gib"] - own_state) * factor - 2
        folder = run_folder(tmp_path / str(factor), [1.0, own * factor, own * factor], peak=peak)
        got = estimate([*PLAN, "--estimate.num_devices=64", "--estimate.total_tokens=1e12",
                        f"--estimate.anchor={folder}"])  # fmt: skip
        a = got["anchor"]
        assert a["ratio"] == pytest.approx(factor) and a["world_size"] == 8 and a["differs_from_plan"] == []
        assert got["tokens_per_sec_per_device"] == pytest.approx(plain["tokens_per_sec_per_device"] * factor)
        assert got["mfu_percent"] == pytest.approx(plain["mfu_percent"] * factor)
        assert got["gpu_hours"] == pytest.approx(plain["gpu_hours"] / factor)
        assert got["step_time_s"] == pytest.approx(sum(got["step_time_breakdown_s"].values()))
        assert got["step_time_breakdown_s"]["anchor_correction"] == pytest.approx(
            plain["step_time_s"] / factor - plain["step_time_s"]
        )
        assert got["unanchored"]["tokens_per_sec_per_device"] == plain["tokens_per_sec_per_device"]
        state = state_gib(plain)
        assert a["memory_ratio"] == pytest.approx(factor) and a["memory_not_anchored"] is None
        assert got["memory_gib"] == pytest.approx(state + (plain["memory_gib"] - state) * factor)
        assert got["memory_gib"] == pytest.approx(sum(got["memory_breakdown_gib"].values()))
        assert got["memory_over_usable"] == pytest.approx(
            plain["memory_over_usable"] * got["memory_gib"] / plain["memory_gib"]
        )
        assert got["unanchored"]["memory_gib"] == plain["memory_gib"]
        assert got["unanchored"]["fits"] == plain["fits"]


def test_the_report_names_the_anchor_and_a_different_configuration(tmp_path, capsys):
    folder = run_folder(tmp_path, [1.0, 5000.0, 5000.0], overrides=("--compile.enable=true",))
    assert main([*PLAN, "--estimate.num_devices=64", f"--estimate.anchor={folder}"]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"anchor     {folder}: 5,000 tokens/s per device measured \(2 log rows after step 1, 8"
                     r" devices, H100 SXM\), [\d,]+ estimated for its configuration: step time x [\d.]+", out)  # fmt: skip
    assert "anchor_correction" in out
    assert "memory is not anchored: the anchor differs in compile (on, the plan off)" in out
    assert "the anchor differs from the plan in compile (on, the plan off)" in out


@pytest.mark.parametrize(
    "overrides, plan, peak, why",
    [
        (("--activation_checkpoint.mode=full",), [], 60.0,
         "the anchor differs in activation checkpointing (full, the plan none)"),
        ((), ["--parallelism.pipeline_parallel_degree=2", "--training.local_batch_size=2"], 60.0, "a pipeline plan's peak is its worst stage's"),
        ((), [], 0.5, "its logged peak is below the estimate of its weights, gradients and optimizer states alone"),
    ],
)  # fmt: skip
def test_memory_is_anchored_only_on_a_run_it_was_validated_for(tmp_path, overrides, plan, peak, why):
    """Not across another activation checkpointing, not for a pipeline plan, not on a peak below the state."""
    folder = run_folder(tmp_path, [1.0, 5000.0, 5000.0], overrides=(*overrides, *plan), peak=peak)
    argv = [*PLAN, "--estimate.num_devices=64", *plan]
    plain = estimate(argv)
    got = estimate([*argv, f"--estimate.anchor={folder}"])
    assert got["anchor"]["memory_ratio"] is None and why in got["anchor"]["memory_not_anchored"]
    assert got["memory_gib"] == plain["memory_gib"] and "anchor_correction" not in got["memory_breakdown_gib"]


def test_a_pipeline_anchor_is_compared_with_its_first_stage(tmp_path, capsys):
    """A run logs rank 0's peak: a pipeline anchor's estimated peak in the report and JSON is its rank 0's (the first
    stage), not its worst stage's; the plan's report lists every pipeline rank's peak, rank 0 first."""
    pp = [
        "--parallelism.pipeline_parallel_degree=4",
        "--training.local_batch_size=4",
        "--activation_checkpoint.mode=full",
    ]
    folder = run_folder(tmp_path, [1.0, 5000.0, 5000.0], overrides=tuple(pp), peak=60.0)
    own = estimate([*PLAN, "--estimate.num_devices=8", *pp])  # the anchor's configuration at its world size
    by_rank = own["memory_by_pipeline_rank_gib"]
    # under full AC the last stage's logits outweigh the first stage's activations in flight
    assert len(by_rank) == 4 and max(by_rank) == own["memory_gib"] > by_rank[0]
    got = estimate([*PLAN, "--estimate.num_devices=64", *pp, f"--estimate.anchor={folder}"])
    assert got["anchor"]["estimated_memory_gib"] == pytest.approx(by_rank[0])
    assert main([*PLAN, "--estimate.num_devices=8", *pp]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "by pipeline rank" in x)
    assert line.split(":")[1].split()[:4] == [f"{v:.2f}" for v in by_rank]
    assert estimate([*PLAN, "--estimate.num_devices=8"])["memory_by_pipeline_rank_gib"] is None


def test_the_accuracy_line_is_the_anchored_pairs(tmp_path, capsys):
    folder = run_folder(tmp_path, [1.0, 5000.0, 5000.0])
    argv = [a for a in PLAN if a != "--estimate.accuracy=false"]
    assert main([*argv, "--estimate.num_devices=64", f"--estimate.anchor={folder}"]) == 0
    out = capsys.readouterr().out
    assert (
        "tokens/s/device, anchored: on " in out
        and "of one source, model, compile mode and layout kind" in out
    )
    assert re.search(r"memory GiB, anchored: on \d+ pairs of published runs of one source, model, compile mode,"
                     r" layout kind and activation checkpointing", out)  # fmt: skip


@pytest.mark.parametrize(
    "extra, setup, message",
    [
        (
            ["--estimate.search=true"],
            None,
            "estimate.anchor scales one training plan; leave it out for a search",
        ),
        (["--estimate.mode=inference"], None, "leave it out for inference"),
        (["--estimate.hardware=b200"], "H100 SXM", "the run ran on H100 SXM, the plan is for B200"),
        # the other memory of the same die: its header names it, so it is not the planned part
        (["--estimate.hardware=gh200-144gb"], "GH200", "the run ran on GH200, the plan is for GH200 144GB"),
        (["--estimate.hardware=cpu"], "cpu", "estimate.anchor is for GPU plans"),
        ([], "missing", "not a folder"),
        ([], "no metrics", "no metrics.jsonl"),
        ([], "warm-up only", "no log row with throughput/tokens_per_sec_per_device after step 1"),
    ],
)
def test_refusals_are_one_line(tmp_path, capsys, extra, setup, message):
    if setup == "missing":
        folder = tmp_path / "nothing"
    else:
        folder = run_folder(tmp_path, [1.0] if setup == "warm-up only" else [1.0, 5000.0],
                            part=setup if setup in ("H100 SXM", "GH200", "cpu") else "H100 SXM")  # fmt: skip
        if setup == "no metrics":
            (folder / "metrics.jsonl").unlink()
    assert main([*PLAN, f"--estimate.anchor={folder}", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_40gb_a100_plan_takes_a_run_whose_header_names_the_a100(tmp_path):
    """The run header names the MFU table's part, and a 40 GB A100's is "A100" (one peak for both): a plan for
    `a100-40gb` takes that run (a GH200 run is refused for a GH200 144GB plan: test_refusals_are_one_line)."""
    folder = run_folder(tmp_path, [1.0, 5000.0], part="A100")
    got = estimate([*PLAN, "--estimate.hardware=a100-40gb", f"--estimate.anchor={folder}"])
    assert got["hardware"]["name"] == "A100 40GB" and got["anchor"]["device"] == "A100"


def test_a_run_whose_log_does_not_name_its_device_is_taken_as_planned(tmp_path):
    folder = run_folder(tmp_path, [1.0, 5000.0], part=None)
    got = estimate([*PLAN, f"--estimate.anchor={folder}"])
    assert got["anchor"]["device"] is None
    with pytest.raises(UserError, match="not a folder"):
        anchor.read_run(str(tmp_path / "elsewhere"))


def test_anchoring_on_a_similar_published_run_beats_none_and_any_other():
    """What docs/estimate.md says of the published tokens/s rows, computed: each row estimated as anchored on every
    other row of its source and device with the same model, compile mode and layout kind has a smaller median error
    and no fewer figures within the goal than the same rows unanchored; anchored on any other row of its source
    and device, the median is not as low (the report says so when an anchor differs from the plan)."""
    rows = cross_validated(quantities=("tokens/s/device", "TFLOPS/device"))
    plain = {(r["id"], r["what"]): r["error"] for r in rows}
    similar, anyway = anchored(rows), anchored(rows, similar=False)
    base = [plain[(p["id"], "TFLOPS/device" if (p["id"], "TFLOPS/device") in plain else "tokens/s/device")]
            for p in similar]  # fmt: skip

    def med(errors):
        return statistics.median(abs(e) for e in errors)

    assert med(p["error"] for p in similar) < med(base)
    assert sum(abs(p["error"]) <= 0.15 for p in similar) >= sum(abs(e) <= 0.15 for e in base)
    assert med(p["error"] for p in similar) < med(p["error"] for p in anyway)
    docs = (ROOT / "docs" / "estimate.md").read_text()
    stated = (
        f"{len(similar)} pairs: median absolute error {med(p['error'] for p in similar) * 100:.2f} % anchored,"
        f" {med(base) * 100:.2f} % unanchored"
    )
    assert stated in docs, f"docs/estimate.md should state: {stated}"
    readme = " ".join((ROOT / "README.md").read_text().split())
    summary = f"error from {med(base) * 100:.1f} % to {med(p['error'] for p in similar) * 100:.1f} %"
    assert summary in readme, f"README.md should state: {summary}"


def test_anchoring_memory_on_a_published_run_of_the_same_kind():
    """What docs/estimate.md says of the published peaks, computed: each estimated as anchored (memory.scale_peak) on
    every other peak of its source and device with the same model, compile mode, layout kind (not pipeline) and
    activation checkpointing has a smaller median error and no fewer within the goal; no run that ran is then said
    not to fit; and a published out-of-memory run ([[oom]]) with such a run in its source does not fit once anchored
    on it (torchtitan#533's batch 6 on its batch 5: unanchored, it is estimated to fit)."""
    ref = load_reference()
    rows = cross_validated(ref, quantities=("memory GiB",))
    plain = {r["id"]: r["error"] for r in rows}
    pairs = anchored(rows, memory=True)
    base = [plain[p["id"]] for p in pairs]

    def med(errors):
        return statistics.median(abs(e) for e in errors)

    assert med(p["error"] for p in pairs) < med(base)
    assert sum(abs(p["error"]) <= 0.10 for p in pairs) >= sum(abs(e) <= 0.10 for e in base)
    ran = {
        row["id"]: training_estimate(ref, row)
        for row in ref["training"]
        if row["id"] in {p["id"] for p in pairs}
    }
    for p in pairs:
        e = ran[p["id"]]
        assert p["published"] * (1 + p["error"]) / e["memory_gib"] * e["memory_over_usable"] <= 1, p
    checked = []
    for oom in ref["oom"]:
        e = training_estimate(ref, oom)
        kind = {**anchor_kind(e), **device_and_layout(e)}
        for r in rows:
            if r["source"] == oom["source"] and all(r[k] == v for k, v in kind.items()):
                ratio = rest_ratio(r["published"], r["estimated"], r["state_gib"])
                peak = scale_peak(e["memory_gib"], state_gib(e), ratio)
                assert peak / e["memory_gib"] * e["memory_over_usable"] > 1, (oom["id"], r["id"])
                checked.append((oom["id"], e["fits"]))
    assert ("h100_gpt2shape_fsdp4_b6_no_ac_compile_pr533_oom", True) in checked
    docs = (ROOT / "docs" / "estimate.md").read_text()
    stated = (
        f"{len(pairs)} pairs of that kind: median absolute error {med(base) * 100:.2f} % unanchored,"
        f" {med(p['error'] for p in pairs) * 100:.2f} % anchored"
    )
    assert stated in docs, f"docs/estimate.md should state: {stated}"


# ---- torchtitan logs as anchors (torchtitan/estimate/torchtitan_log.py)

LOGS = ROOT / "tests" / "assets" / "torchtitan_logs"
TITAN_CONFIGS = ROOT / "tests" / "assets" / "torchtitan_configs"


@pytest.mark.parametrize(
    "name, world, degrees, device, median, memory, settings",
    [
        (  # rank prefixes of torchrun, colours, 'dp' mesh, "GPU capacity ... (0)", wps, no batch line
            "2024-06_llama3_8b_fsdp8.log", 8, {"dp_shard": 8}, "H100 SXM", 6620.0, 47.81,
            {"compile.components": ["model"], "activation_checkpoint.mode": "selective", "float8.enable": False},
        ),
        (  # pasted: indented, colour codes without their ESC, "mmemory:", the batch on "Training starts at step 1"
            "2025-02_llama3_8b_fsdp8_pasted.log", 8, {"dp_shard": 8}, "H200", 7045.5, 49.6,
            {"compile.enable": False, "activation_checkpoint.mode": "selective", "training.local_batch_size": 1,
             "training.seq_len": 8192, "training.global_batch_size": 8},
        ),
        (  # srun labels with rank 1's lines mixed in, a validation line, tps, the batch line, float8 rowwise
            "2025-08_llama3_8b_fsdp4_tp2.log", 8, {"dp_shard": 4, "tp": 2}, "H100 SXM", 4005.0, 44.31,
            {"compile.components": ["model", "loss"], "activation_checkpoint.mode": "full",
             "float8.recipe": "rowwise", "training.local_batch_size": 2, "training.global_batch_size": 8},
        ),
        (  # no colours, no prefixes, the keyword mesh line of 2025-12, HSDP with two micro-steps
            "2026-01_llama3_8b_hsdp.log", 8, {"dp_replicate": 2, "dp_shard": 4}, "H200", 7130.0, 52.5,
            {"compile.enable": False, "activation_checkpoint.mode": "none", "float8.recipe": "tensorwise",
             "training.global_batch_size": 16, "estimate.ac_early_stop": False},
        ),
        (  # the registry era: SelectiveAC's class name, the batch in tokens per DP rank and per train step
            "2026-09_llama3_8b_registry.log", 8, {"dp_shard": 8}, "H100 SXM", 6970.0, 58.36,
            {"compile.components": ["model"], "activation_checkpoint.mode": "selective",
             "training.local_batch_size": 2, "training.seq_len": 8192, "training.global_batch_size": 32,
             "estimate.ac_early_stop": False},
        ),
    ],
)  # fmt: skip
def test_a_torchtitan_log_of_each_era_is_read(name, world, degrees, device, median, memory, settings):
    run = anchor.read_anchor(str(LOGS / name))
    assert (run.world_size, run.device, run.tokens_per_sec_per_device, run.memory_gib) == (
        world,
        device,
        median,
        memory,
    )
    assert run.titan.params == 8_030_261_248
    assert {k: v for k, v in run.titan.degrees.items() if v > 1} == degrees
    assert {k: run.titan.settings[k] for k in settings} == settings
    # only a log dated after torchtitan#1580 (2025-08-29) says its checkpointed blocks recompute w2
    assert ("estimate.ac_early_stop" in run.titan.settings) == ("estimate.ac_early_stop" in settings)


def test_a_torchtitan_log_after_its_early_stop_default_prices_the_whole_recompute(tmp_path):
    """torchtitan#1580 (2025-08-29) made its checkpointed blocks recompute their whole forward, w2 included; the GC
    line's wording of torchtitan#1737 (2025-09-22) dates a log after it. The same eager full-AC run logged in both
    wordings: the later one is estimated as --estimate.ac_early_stop=false estimates it, slower, so the plan (this
    trainer, which stops early) is scaled up by as much; the earlier one as the plan's default."""
    eager = {"drop": "Compiling"}
    before = _edited_log(tmp_path / "before", **eager)
    after = _edited_log(tmp_path / "after", replace=("collection 0.00 seconds", "collection took 0.00 seconds"),
                        **eager)  # fmt: skip
    plan = [*PLAN, "--estimate.num_devices=64"]
    got = {log: estimate([*plan, f"--estimate.anchor={log}"])["anchor"] for log in (before, after)}
    assert "estimate.ac_early_stop" not in got[before]["from_log"]
    assert got[after]["from_log"]["estimate.ac_early_stop"] is False
    by_flag = {
        flag: estimate([*plan, f"--estimate.anchor={before}", f"--estimate.ac_early_stop={flag}"])["anchor"]
        for flag in ("true", "false")
    }
    rate = {log: a["estimated_tokens_per_sec_per_device"] for log, a in got.items()}
    assert rate[before] == by_flag["true"]["estimated_tokens_per_sec_per_device"]
    assert rate[after] == by_flag["false"]["estimated_tokens_per_sec_per_device"]
    assert rate[after] < 0.99 * rate[before]
    assert got[after]["ratio"] > got[before]["ratio"]


def test_several_ranks_logging_without_a_prefix_count_each_step_once(tmp_path):
    """All ranks' lines in one file with no prefix to tell them apart (LOG_RANK=0,1,...): a step is counted once,
    with its first line's tokens/s and the largest memory of its lines."""
    text = (LOGS / "2026-01_llama3_8b_hsdp.log").read_text()
    other = text.replace("tps: 7,100", "tps: 1").replace("memory: 52.50GiB", "memory: 60.00GiB")
    steps = [x for x in other.splitlines() if "step:" in x]
    (tmp_path / "all.log").write_text(text + "\n".join(steps) + "\n")
    run = anchor.read_anchor(str(tmp_path / "all.log"))
    assert (run.rows, run.tokens_per_sec_per_device, run.memory_gib) == (2, 7130.0, 60.0)


def test_a_torchtitan_log_anchors_as_a_run_folder_of_the_same_run_does(tmp_path):
    """The log path ends in the validated mechanism: the same measured tokens/s and configuration through a run
    folder of this trainer give the same anchored plan."""
    plan = [*PLAN, "--estimate.num_devices=64", "--estimate.total_tokens=1e12"]
    titan = estimate([*plan, f"--estimate.anchor={LOGS / '2024-06_llama3_8b_fsdp8.log'}"])
    folder = run_folder(tmp_path, [1234.0, 6601.0, 6650.0, 6620.0], overrides=(
        "--parallelism.data_parallel_shard_degree=8", "--compile.enable=true", "--compile.components=model",
        "--activation_checkpoint.mode=selective"))  # fmt: skip
    ours = estimate([*plan, f"--estimate.anchor={folder}"])
    assert titan["anchor"]["ratio"] == pytest.approx(ours["anchor"]["ratio"])
    for key in ("tokens_per_sec_per_device", "step_time_s", "gpu_hours"):
        assert titan[key] == pytest.approx(ours[key])
    assert titan["anchor"]["kind"] == "torchtitan log" and titan["anchor"]["config"] == "the plan's config"
    assert titan["anchor"]["from_log"] == {
        "parallelism.data_parallel_shard_degree": 8, "compile.enable": True, "compile.components": ["model"],
        "activation_checkpoint.mode": "selective"}  # fmt: skip


@pytest.mark.parametrize("era", ["2024", "2025", "2026"])
def test_the_run_s_torchtitan_toml_is_converted_and_the_log_overrides_it(era):
    log, config = LOGS / "2025-08_llama3_8b_fsdp4_tp2.log", TITAN_CONFIGS / era / "llama3_8b.toml"
    got = estimate([*PLAN, f"--estimate.anchor={log}", f"--estimate.anchor_config={config}"])
    a = got["anchor"]
    assert a["config"] == str(config) and a["world_size"] == 8
    assert (
        a["from_log"]["parallelism.tensor_parallel_degree"] == 2
        and a["from_log"]["float8.recipe"] == "rowwise"
    )


def test_the_report_names_a_torchtitan_log_and_what_it_changed(capsys):
    assert (
        main(
            [*PLAN, "--estimate.num_devices=64", f"--estimate.anchor={LOGS / '2024-06_llama3_8b_fsdp8.log'}"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert re.search(r"2024-06_llama3_8b_fsdp8\.log \(torchtitan log\): 6,620 tokens/s per device measured \(3 step"
                     r" lines after step 1, 8 devices, H100 SXM\)", out)  # fmt: skip
    assert (
        "estimated with the plan's config; what its log states changed: parallelism.data_parallel_shard_degree = 8,"
        " compile.enable = true, compile.components = model, activation_checkpoint.mode = selective" in out
    )
    assert "its peak memory (rank 0's): 47.81 GiB measured" in out


def _edited_log(tmp_path: Path, drop: str = "", replace: tuple[str, str] = ("", ""),
                name: str = "2025-08_llama3_8b_fsdp4_tp2.log") -> Path:  # fmt: skip
    text = (LOGS / name).read_text()
    lines = [
        x.replace(*replace) if replace[0] else x
        for x in text.splitlines()
        if not (drop and re.search(drop, x))
    ]
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "run.log"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    "edit, extra, message",
    [
        ({"drop": "device mesh"}, [], "no 'Building ... device mesh' line, so not the world size either"),
        ({"drop": r"step: [1-4]0 "}, [], "no step line after step 1 (step 1 is the warm-up)"),
        ({"drop": "step:"}, [], "no torchtitan step line"),
        ({"replace": ("recipe rowwise", "recipe mxfp8")}, [], "the float8 recipe 'mxfp8'"),
        ({"replace": ("['dp_shard', 'tp'], [4, 2]", "['dp_shard', 'ep'], [4, 2]")}, [], "dimensions a Llama 3"),
        ({}, ["--estimate.hardware=b200"], "the run ran on H100 SXM, the plan is for B200"),
        ({}, [f"--estimate.anchor_config={TITAN_CONFIGS / '2025' / 'llama3_70b.toml'}"],
         "the run's model has 8,030,261,248 parameters (its log), "),
        ({}, ["--estimate.anchor_config=nowhere.toml"], "config file not found: nowhere.toml"),
        ({"replace": ("Applied full", "Applied memory_budget")}, [],
         "the run used memory_budget activation checkpointing; the estimator prices full and selective"),
        ({"replace": ("SelectiveAC", "MemoryBudgetAC"), "name": "2026-09_llama3_8b_registry.log"}, [],
         "the run used MemoryBudgetAC activation checkpointing"),
        ({"replace": ("Applied SelectiveAC activation checkpointing to the model",
                      "Converted Linear layers to NVFP4Linear"), "name": "2026-09_llama3_8b_registry.log"}, [],
         "the run trained with NVFP4 linear layers; the estimator prices bf16 and float8"),
        ({"replace": ("Float8 training active with recipe rowwise", "MX training active with recipe mxfp8")}, [],
         "the run trained with mxfp8 linear layers"),
        ({"replace": ("16384 tokens per DP rank", "12000 tokens per DP rank"),
          "name": "2026-09_llama3_8b_registry.log"}, [],
         "the run's 12000 tokens per DP rank are not whole rows of its maximum context length 8192"),
    ],
)  # fmt: skip
def test_torchtitan_log_refusals_are_one_line(tmp_path, capsys, edit, extra, message):
    log = _edited_log(tmp_path, **edit)
    assert main([*PLAN, f"--estimate.anchor={log}", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_anchor_config_is_refused_with_a_run_folder(tmp_path, capsys):
    folder = run_folder(tmp_path, [1.0, 5000.0])
    argv = [*PLAN, f"--estimate.anchor={folder}", "--estimate.anchor_config=train_configs/llama3_8b.toml"]
    assert main(argv) == 2
    assert "estimate.anchor_config is for a torchtitan log" in capsys.readouterr().err
