"""Anchoring a training estimate on a measured run of the same cluster (`--estimate.anchor`).

What the published runs say (docs/estimate.md, "Anchoring on a measured run"): the estimate's tokens/s error is
mostly a level that each source (one cluster, one software date) shares, not noise from run to run. Scaling an
estimate by the measured / estimated tokens/s of another published run of the same source, device, model, compile
mode and layout kind brings the median error of 498 such pairs from 8.66 % to 3.75 %; across other differences it
helps less and loses figures from the goal (1,554 pairs of any two runs of one source and device: 8.47 % -> 6.43 %,
1,279 -> 1,164 within 15 %). The peak memory beyond the training state (weights, gradients, optimizer states: byte
counts, kept) is scaled by the anchor's measured / estimated part beyond its own state, only when the anchor also
shares the plan's activation checkpointing and is not a pipeline run: on the 122 published pairs of that kind the
median error goes from 1.73 % to 0.59 % (98 -> 119 within 10 %), no run that ran is then said not to fit, and
torchtitan#533's batch 6 ("the max local batch size is 5"; estimated to fit by 3.5 %) does not fit once anchored on
its batch-5 run. Across other differences scaling memory hurt (2.52 % -> 5.27 % on any two runs), so the report
then gives the anchor's measured and estimated peaks and says why memory is not anchored.

The run is read from its folder as the trainer writes it: `config.toml` (the effective config), `metrics.jsonl`
(`throughput/tokens_per_sec_per_device` of every log row; the world size is the global over the per-device
tokens/s) and the header of `logs/rank0.log` (the device: the MFU peak's "table: <part>" or "N x cpu"). Its
tokens/s is the median over the log rows after step 1 (step 1 is the warm-up: compilation, allocator and
communicator set-up). Or the run is a torchtitan log of rank 0 (a file; torchtitan_log.py): its step lines'
tokens/s per device and memory, the world size of its mesh line, the device of its capacity line; its configuration
is `--estimate.anchor_config` (torchtitan's TOML, converted, or ours) or else the plan's, with what the log states
(layout, batch, compile, activation checkpointing, float8) over it, and a model whose parameter count differs from
the log's is refused; a log dated after torchtitan#1580 (2025-08-29) is estimated with its whole-block recompute
(`--estimate.ac_early_stop=false`). The published runs anchoring was validated on are torchtitan's. The anchor's own
configuration is estimated with the plan's [estimate] options and its own world size; the plan's step time gets the term
`anchor_correction` (its step time / ratio - its step time), and every figure derived from the step time moves with
it; an anchored peak gets the memory term `anchor_correction` and its fits verdict follows. The unanchored figures
stay in the JSON (`unanchored`).
"""

from __future__ import annotations

import copy
import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from torchtitan.errors import UserError
from torchtitan.metrics.hardware import match_device

from .memory import rest_ratio, scale_peak, state_gib
from .torchtitan_log import TorchtitanLog, read_log

WARMUP_STEP = 1  # log rows of steps <= this are left out of the measured tokens/s


@dataclass
class MeasuredRun:
    folder: str
    world_size: int
    tokens_per_sec_per_device: float  # median over the log rows after WARMUP_STEP
    rows: int  # log rows in that median
    memory_gib: float | None  # the largest logged peak: max reserved (CUDA), max RSS (CPU)
    device: str | None  # the run header's part ("H100 SXM"), "cpu", or None when the log does not say
    titan: TorchtitanLog | None = None  # a torchtitan log's settings and device name (torchtitan_log.py)


def _device_of(log: Path) -> str | None:
    """The part the run ran on, from its header lines (torchtitan/header.py): "MFU peak: ... from table: <part>
    (dense bf16)" on a device of the peak table, "model ...: ..., N x cpu" on a CPU."""
    if not log.is_file():
        return None
    text = log.read_text(errors="replace")
    if m := re.search(r"MFU peak: .* from table: (.+?) \(dense bf16\)", text):
        return m.group(1)
    if m := re.search(r"^\S+ \S+ INFO model .*, \d+ x (\w+)$", text, re.M):
        return m.group(1) if m.group(1) == "cpu" else None
    return None


def read_run(folder: str) -> MeasuredRun:
    """The measured figures of a run folder of this trainer (one line naming what is missing otherwise)."""
    path = Path(folder)
    if not path.is_dir():
        raise UserError(f"estimate.anchor {folder}: not a folder (give a run's job.dump_folder)")
    for name in ("config.toml", "metrics.jsonl"):
        if not (path / name).is_file():
            raise UserError(
                f"estimate.anchor {folder}: no {name} (a run folder of this trainer holds both; for a torchtitan run,"
                " give its console log file)"
            )
    records = []
    for n, line in enumerate((path / "metrics.jsonl").read_text().splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                raise UserError(f"estimate.anchor {folder}/metrics.jsonl: line {n} is not JSON") from None
    key = "throughput/tokens_per_sec_per_device"
    steady = [r for r in records if r.get("step", 0) > WARMUP_STEP and r.get(key)]
    if not steady:
        raise UserError(
            f"estimate.anchor {folder}/metrics.jsonl: no log row with {key} after step {WARMUP_STEP}"
            " (step 1 is the warm-up): anchor on a run that logged a later step"
        )
    per_device = statistics.median(r[key] for r in steady)
    world = round(statistics.median(r["throughput/tokens_per_sec_global"] / r[key] for r in steady))
    peaks = [r[k] for r in records for k in ("memory/max_reserved_gib", "memory/max_rss_gib") if k in r]
    device = _device_of(path / "logs" / "rank0.log")
    return MeasuredRun(folder, max(world, 1), per_device, len(steady), max(peaks) if peaks else None, device)


def read_anchor(path: str) -> MeasuredRun:
    """A run folder of this trainer (read_run), or a file: a torchtitan log of rank 0 (torchtitan_log.py)."""
    if not Path(path).is_file():
        return read_run(path)
    log = read_log(path)
    steady = [s for s in log.steps if s[0] > WARMUP_STEP]
    if not steady:
        raise UserError(
            f"estimate.anchor {path}: no step line after step {WARMUP_STEP} (step 1 is the warm-up): anchor on a run"
            " that logged a later step"
        )
    return MeasuredRun(
        folder=path,
        world_size=log.world_size,
        tokens_per_sec_per_device=statistics.median(s[1] for s in steady),
        rows=len(steady),
        memory_gib=max(s[2] for s in log.steps),
        device=match_device(log.device) if log.device else None,
        titan=log,
    )


def _titan_config(plan_cfg, config_file: str | None, log: TorchtitanLog):
    """The configuration a torchtitan log's run is estimated with: the config file it used (torchtitan's TOML,
    converted as scripts/convert_torchtitan_config.py does, or ours), else the plan's own, with the plan's [estimate]
    options; then what the log states (layout, batch, compile, activation checkpointing, float8, and a recompute of
    the whole block where the log dates the run after torchtitan#1580) over it. Returns it and {key: the log's value}
    of the values the log changed."""
    from torchtitan.config import JobConfig, parse_args
    from torchtitan.config.manager import _load_toml, apply_sections
    from torchtitan.config.torchtitan_compat import convert
    from torchtitan.config.torchtitan_keys import torchtitan_file_keys

    if config_file is None:
        acfg = copy.deepcopy(plan_cfg)
    elif torchtitan_file_keys(toml := _load_toml(config_file)):
        acfg = apply_sections(JobConfig(), convert(toml, config_file).config, config_file)
    else:
        acfg = parse_args([f"--job.config_file={config_file}"])
    # the plan's [estimate] options, but for what the log dates (its recompute)
    acfg.estimate = copy.deepcopy(plan_cfg.estimate)
    changed = {}
    for key, value in log.settings.items():
        section, name = key.split(".")
        before = getattr(getattr(acfg, section), name)
        if before != value:
            changed[key] = value
            setattr(getattr(acfg, section), name, value)
    return acfg, changed


def _differences(plan: dict, anchor: dict) -> list[str]:
    """How the anchor's configuration differs from the plan's in what anchoring was validated on (the pairs of
    validation.anchored: the same model, compile mode and layout kind)."""
    from .validation import anchor_kind, device_and_layout

    p, a = anchor_kind(plan), anchor_kind(anchor)
    p_kind, a_kind = device_and_layout(plan)["layout"], device_and_layout(anchor)["layout"]
    out = []
    if p["model_params"] != a["model_params"]:
        out.append(f"model ({a['model_params']:,} parameters, the plan {p['model_params']:,})")
    if p["compiled"] != a["compiled"]:
        out.append(
            f"compile ({'on' if a['compiled'] else 'off'}, the plan {'on' if p['compiled'] else 'off'})"
        )
    if p_kind != a_kind:
        out.append(f"layout kind ({a_kind}, the plan {p_kind})")
    return out


def _memory_not_anchored(
    plan: dict, anchor: dict, measured_gib: float | None, differs: list[str]
) -> str | None:
    """Why the plan's peak memory is not scaled by the anchor's measured / estimated peak, or None when it is: the
    anchor must have logged a peak and share the plan's model, compile mode, layout kind (not pipeline parallel) and
    activation checkpointing (the pairs of validation.anchored(memory=True)). `differs`: `_differences(plan,
    anchor)`."""
    from .validation import device_and_layout

    if measured_gib is None:
        return "the run logged no peak memory"
    if device_and_layout(plan)["layout"] == "pipeline parallel":
        return (
            "a pipeline plan's peak is its worst stage's, a run logs rank 0's, and anchoring one published pipeline"
            " peak on the other took its error from +6.6 % to +29 %"
        )
    p_ac, a_ac = plan["layout"]["ac_mode"], anchor["layout"]["ac_mode"]
    if p_ac != a_ac:
        differs = [*differs, f"activation checkpointing ({a_ac}, the plan {p_ac})"]
    if differs:
        return f"the anchor differs in {'; '.join(differs)}"
    if measured_gib <= state_gib(anchor):
        return (
            "its logged peak is below the estimate of its weights, gradients and optimizer states alone"
            f" ({state_gib(anchor):.2f} GiB)"
        )
    return None


def check_plan(est) -> None:
    """Refuse, in one line, what an anchor cannot scale: a search, inference, a CPU plan."""
    from torchtitan.metrics.hardware import device_spec

    if est.search or est.mode == "inference":
        raise UserError(
            f"estimate.anchor scales one training plan; leave it out for {'a search' if est.search else 'inference'}"
        )
    if device_spec(est.hardware).name == "CPU":
        raise UserError(
            "estimate.anchor is for GPU plans: a CPU plan's step is measured by --estimate.calibrate=true already"
        )


def anchor_estimate(cfg, calibration, result: dict) -> None:
    """Scale the training estimate `result` (of `cfg`) by the measured / estimated tokens/s of the run folder
    cfg.estimate.anchor, in place: the step time's `anchor_correction`, the derived figures, and the JSON
    entries `anchor` and `unanchored`."""
    from torchtitan.config import parse_args, validate
    from torchtitan.metrics.hardware import ESTIMATOR_SPECS, device_spec

    from .plan import build_plan
    from .training import estimate_plan

    est = cfg.estimate
    check_plan(est)
    run = read_anchor(est.anchor)
    planned = device_spec(est.hardware)
    # the run's header names its MFU table part: exactly the planned part, except a 40 GB A100, whose runs name the
    # A100 (one peak for both; ESTIMATOR_SPECS holds the planning entries no header names)
    ran_on = device_spec(run.device).name if run.device is not None else None
    if ran_on not in (None, planned.name) and not (
        planned.name in ESTIMATOR_SPECS and planned.name.startswith(ran_on)
    ):
        raise UserError(
            f"estimate.anchor {est.anchor}: the run ran on {run.device}, the plan is for {planned.name};"
            " anchor on a run of the hardware planned"
        )
    if run.titan is None:
        if est.anchor_config:
            raise UserError(
                f"estimate.anchor_config is for a torchtitan log; the run folder {est.anchor} holds its config.toml"
            )
        config, changed = str(Path(est.anchor) / "config.toml"), {}
        acfg = parse_args([f"--job.config_file={config}"])
        acfg.estimate = copy.deepcopy(est)
    else:
        config = est.anchor_config or "the plan's config"
        acfg, changed = _titan_config(cfg, est.anchor_config, run.titan)
    validate(acfg)
    acfg.estimate.num_devices, acfg.estimate.anchor, acfg.estimate.total_tokens = run.world_size, None, None
    anchored = estimate_plan(build_plan(acfg, calibration))
    if run.titan is not None and run.titan.params not in (None, anchored["model"]["params"]):
        raise UserError(
            f"estimate.anchor {est.anchor}: the run's model has {run.titan.params:,} parameters (its log), {config} has"
            f" {anchored['model']['params']:,}: give --estimate.anchor_config the config file the run used"
        )
    ratio = run.tokens_per_sec_per_device / anchored["tokens_per_sec_per_device"]

    step = result["step_time_s"]
    scaled = ("step_time_s", "tokens_per_sec_per_device", "tokens_per_sec_global", "mfu_percent", "memory_gib",
              "memory_over_usable", "fits")  # fmt: skip
    result["unanchored"] = {k: result[k] for k in scaled}
    result["step_time_breakdown_s"]["anchor_correction"] = step / ratio - step
    result["step_time_s"] = step / ratio
    for k in ("tokens_per_sec_per_device", "tokens_per_sec_global", "tflops_per_device", "mfu_percent",
              "mfu_percent_fp8_mixed"):  # fmt: skip
        if k in result:
            result[k] *= ratio
    for k in ("gpu_hours", "days"):
        if k in result:
            result[k] /= ratio
    differs = _differences(result, anchored)
    why_not = _memory_not_anchored(result, anchored, run.memory_gib, differs)
    memory_ratio = None
    if why_not is None:  # the peak's `anchor_correction`; the fits verdict follows it
        state = state_gib(anchored)
        memory_ratio = rest_ratio(run.memory_gib, anchored["memory_gib"], state)
        peak = scale_peak(result["memory_gib"], state_gib(result), memory_ratio)
        result["memory_breakdown_gib"]["anchor_correction"] = peak - result["memory_gib"]
        result["memory_over_usable"] *= peak / result["memory_gib"]
        result["memory_gib"] = peak
        result["fits"] = result["memory_over_usable"] <= 1
    result["anchor"] = {
        "folder": run.folder,
        "kind": "run folder" if run.titan is None else "torchtitan log",
        "config": config,
        "from_log": changed,
        "device": run.device,
        "world_size": run.world_size,
        "log_rows": run.rows,
        "measured_tokens_per_sec_per_device": run.tokens_per_sec_per_device,
        "estimated_tokens_per_sec_per_device": anchored["tokens_per_sec_per_device"],
        "ratio": ratio,
        "measured_memory_gib": run.memory_gib,
        # the estimate of the peak the run logged: rank 0's, its first stage's under pipeline parallelism
        "estimated_memory_gib": (anchored["memory_by_pipeline_rank_gib"] or [anchored["memory_gib"]])[0],
        "memory_ratio": memory_ratio,
        "memory_not_anchored": why_not,
        "differs_from_plan": differs,
    }


def report_lines(a: dict) -> list[str]:
    titan = a["kind"] == "torchtitan log"
    lines = [
        f"anchor     {a['folder']}{' (torchtitan log)' if titan else ''}:"
        f" {a['measured_tokens_per_sec_per_device']:,.0f} tokens/s per device measured"
        f" ({a['log_rows']} {'step lines' if titan else 'log rows'} after step {WARMUP_STEP}, {a['world_size']} devices"
        + (f", {a['device']}" if a["device"] else ", device not named or not known: taken as planned")
        + f"), {a['estimated_tokens_per_sec_per_device']:,.0f} estimated for its configuration: step time x"
        f" {1 / a['ratio']:.3f} (anchor_correction)",
    ]
    if titan:
        stated = ", ".join(f"{k} = {_value(v)}" for k, v in a["from_log"].items()) or "nothing"
        lines.append(f"{'':<10} estimated with {a['config']}; what its log states changed: {stated}")
    if a["measured_memory_gib"] is not None:
        err = a["estimated_memory_gib"] / a["measured_memory_gib"] - 1
        lines.append(
            f"{'':<10} its peak memory (rank 0's): {a['measured_memory_gib']:.2f} GiB measured,"
            f" {a['estimated_memory_gib']:.2f} estimated ({err * 100:+.1f} %): "
            + (
                f"the peak beyond weights, gradients and optimizer states x {a['memory_ratio']:.3f}"
                " (anchor_correction)"
                if a["memory_ratio"] is not None
                else f"memory is not anchored: {a['memory_not_anchored']}"
            )
        )
    if a["differs_from_plan"]:
        lines.append(
            f"{'':<10} the anchor differs from the plan in {'; '.join(a['differs_from_plan'])}: on published runs,"
            " anchoring across such differences helped less and put fewer figures within the goal (docs/estimate.md,"
            " 'Anchoring on a measured run')"
        )
    return lines


def _value(v) -> str:
    return ",".join(v) if isinstance(v, list) else str(v).lower() if isinstance(v, bool) else str(v)
