"""How far estimates like this one were from published runs: the validation table's errors on comparable rows.

A planning number is only as useful as its error bar. The estimator's own validation (tests/estimate_reference.toml,
docs/estimate.md "Validation") holds every published figure it was checked against; this module picks the rows
comparable to the configuration being estimated -- the same device family and the same kind of layout
(validation.layout_kind) -- and reports how far their estimates were from what was published (error = estimated /
published - 1: positive means the estimate was too high). Families: Hopper (H100, H200, H800 and GH200 parts), Ampere
(A100, A800), Blackwell (B200, GB200, B300, GB300), CDNA 3 (MI300X, MI325X), CDNA 4 (MI355X), CPU (compared on this
project's calibrated CPU rows: step time and resident memory). When no row of the family has that layout kind, the
family's rows of every layout are used, and when the family has none, every row; the result names the scope it used.

The errors are the cross-validated ones (validation.cross_validated, the rows of the quantities compared): a
training row is estimated with the shipped constants (none of training's is fitted), a decode row with the decode
step's per-layer overhead fitted without its own source. That takes one to two seconds, so the CLI attaches it once
per estimate (training and inference; a search: its best layout), not to each layout a search ranks.
Inference estimates are compared on the decode rows (gpt-fast's and torchao's tables), whose layout kind is one
device or tensor parallel.

Where at least RANGE_FIGURES rows are comparable, an 80 % interval of their errors (`interval_80`: split conformal
prediction's order statistics, which hold a new run's error at least 80 % of the time when runs are exchangeable) is
turned into a range for the estimate's own figure (actual = estimate / (1 + error)): tokens/s, peak memory, decode
tokens/s or step time, and with a token budget the device-hours and days. `held_out_coverage` checks how often such a
range, made from the other sources' rows, held a published figure (docs/estimate.md, "Error bars held out").

The same errors say how sure a training plan's FITS / DOES NOT FIT is: a comparable published peak whose estimate
was low by more than this plan's headroom (estimate / (device memory - the CUDA context) - 1, the fits check's)
would, at that error, not fit, and one high by more than its excess would fit. `accuracy_of` counts them
(`verdict_flipped_by`); the report prints the count when it is not zero (torchtitan#533's GPT-2-sized run on 4 x 96
GB H100s: batch 5 published 81.67 GiB, estimated 75.95, -7.0 %; "the max local batch size is 5", where batch 6 is
estimated 90.76 GiB of 94.04 usable, FITS by 3.5 %).
"""

from __future__ import annotations

import math
import statistics

from . import rates, validation

# a silicon twin (rates.SILICON_TWINS: H800, A800, MI325X, GH200) is in its twin's family
FAMILIES = {
    "Hopper": ("H100 SXM", "H100 NVL", "H100 PCIe", "H200", "H200 NVL"),
    "Ampere": ("A100", "A100 40GB"),
    "Blackwell": ("B200", "GB200", "B300", "GB300"),
    "CDNA 3": ("MI300X",),
    "CDNA 4": ("MI355X",),
}
# the table's quantities a training / an inference / a CPU training estimate is compared on
QUANTITIES = {"training": ("tokens/s/device", "memory GiB"), "inference": (validation.DECODE_QUANTITY,),
              "CPU": validation.CPU_QUANTITIES}  # fmt: skip
# each quantity's figure in an estimate's JSON, and its unit in the report
ESTIMATE_KEYS = {"tokens/s/device": ("tokens_per_sec_per_device", "tokens/s per device"),
                 "memory GiB": ("memory_gib", "GiB"),
                 validation.DECODE_QUANTITY: ("decode_tokens_per_sec", "tokens/s while decoding"),
                 "step time s": ("step_time_s", "s a step"), "max RSS GiB": ("memory_gib", "GiB")}  # fmt: skip
# The range an estimate prints is an 80 % interval of the comparable rows' errors (interval_80), printed only where
# at least this many rows are comparable (the interval's ends are rows from 9 on; with fewer it would be unbounded).
RANGE_FIGURES = 10


def interval_80(errors: list[float]) -> tuple[float, float]:
    """The 80 % interval of split conformal prediction (Vovk, Gammerman and Shafer, Algorithmic Learning in a Random
    World, 2005; Lei, G'Sell, Rinaldo, Tibshirani and Wasserman, JASA 113 (2018), 1094-1111): of n errors, the
    floor(0.1 (n + 1))-th and the ceil(0.9 (n + 1))-th smallest. If a new run's error is exchangeable with these n, its
    rank among the n + 1 is uniform, so it lies between them with probability (k_high - k_low) / (n + 1) >= 80 %
    (10 rows: the smallest and the largest, 9 / 11 = 82 %). The 10th and 90th percentiles of the same rows
    (interpolated between order statistics) hold it about 0.8 (n - 1) / (n + 1) of the time: 65 % for 10 rows.
    Needs n >= 9."""
    e = sorted(errors)
    n = len(e)
    if n < 9:  # floor(0.1 (n + 1)) would be 0: no lower end
        raise ValueError(f"an 80 % interval needs at least 9 errors, got {n}")
    return e[math.floor(0.1 * (n + 1)) - 1], e[math.ceil(0.9 * (n + 1)) - 1]


def family(device: str) -> str:
    part = rates.silicon(device)
    return next((f for f, names in FAMILIES.items() if part in names), device)


def comparable(
    rows: list[dict], fam: str, kind: str, what: str, ratio: float | None = None, device: str | None = None
) -> dict | None:
    """Errors of the table rows of quantity `what` closest to (device family `fam`, layout kind), and their scope.
    `ratio` (this plan's estimated peak / the device's memory less the CUDA context): also count the rows whose
    error, applied to this plan (actual = estimate / (1 + error)), would turn its fits verdict over
    (`verdict_flipped_by`). `device`: also count the rows that ran on that very part (`on_this_part`; 0 for a part
    known only through its family, as a silicon twin)."""
    rows = [r for r in rows if r["what"] == what and "device" in r]
    for scope, keep in (
        (f"{fam}, {kind}", lambda r: family(r["device"]) == fam and r["layout"] == kind),
        (f"{fam}, every layout", lambda r: family(r["device"]) == fam),
        ("every device and layout", lambda r: True),
    ):
        errors = [r["error"] for r in rows if keep(r)]
        if errors:
            goal = next(r["goal"] for r in rows if keep(r))
            out = {"scope": scope, "figures": len(errors), "median_error": statistics.median(errors),
                   "min_error": min(errors), "max_error": max(errors),
                   "within_goal": sum(abs(e) <= goal for e in errors), "goal": goal}  # fmt: skip
            if len(errors) >= RANGE_FIGURES:
                out["p10_error"], out["p90_error"] = interval_80(errors)
            if device is not None:
                out["part"] = device
                out["on_this_part"] = sum(1 for r in rows if keep(r) and r["device"] == device)
            if ratio is not None:  # actual > capacity <=> 1 + error < ratio
                out["verdict_flipped_by"] = sum((1 + e < ratio) == (ratio <= 1) for e in errors)
            return out
    return None


def _quantities(estimate: dict) -> tuple[str, ...]:
    """What an estimate is compared on: decode tokens/s for generation (on any device: no CPU decode row exists, so a
    CPU's is compared with every device's), a CPU training plan's step time and peak RSS, else tokens/s and memory."""
    if estimate["mode"] == "training" and validation.device_and_layout(estimate)["device"] == "CPU":
        return QUANTITIES["CPU"]
    return QUANTITIES[estimate["mode"]]


def rows_for(estimate: dict) -> list[dict] | None:
    """The cross-validated table rows an estimate like this one is compared on (None: the table is not installed);
    computed once for the layouts of a search, which share device and quantities."""
    if not validation.REFERENCE.exists():
        return None
    return validation.cross_validated(quantities=_quantities(estimate))


def accuracy_of(estimate: dict, rows: list[dict] | None = None) -> dict:
    """The JSON `validation` entry of a training or inference estimate: per quantity, the comparable rows' errors."""
    if rows is None:
        rows = rows_for(estimate)
    if rows is None:
        return {"unavailable": f"the validation table {validation.REFERENCE} is not in this installation"}
    case = validation.device_and_layout(estimate)
    whats = _quantities(estimate)
    # the fits check's ratio (memory.training_memory: the peak over the device's memory less the CUDA context)
    ratio = (
        estimate["memory_over_usable"] if estimate["mode"] == "training" and case["device"] != "CPU" else None
    )
    found = {
        what: comparable(
            rows,
            family(case["device"]),
            case["layout"],
            what,
            ratio if what == "memory GiB" else None,
            case["device"],
        )
        for what in whats
    }
    anch = estimate.get("anchor")
    if anch and "tokens/s/device" in found:  # anchor.py: the anchored pairs' errors
        similar = not anch["differs_from_plan"]
        pairs = validation.anchored(rows, similar)
        pairs = comparable(pairs, family(case["device"]), case["layout"], "tokens/s/device")
        if pairs:
            found["tokens/s/device"] = {**pairs, "anchored": "similar" if similar else "any"}
    if anch and anch.get("memory_ratio") is not None and "memory GiB" in found:  # a peak anchored alike
        pairs = comparable(validation.anchored(rows, memory=True), family(case["device"]), case["layout"],
                           "memory GiB", ratio)  # fmt: skip
        if pairs:
            found["memory GiB"] = {**pairs, "anchored": "memory"}
    out = {what: a for what, a in found.items() if a}
    if ratio is not None and "memory GiB" in out:
        out["memory GiB"]["peak_over_capacity"] = ratio
    for what, a in out.items():
        _expected(estimate, what, a)
    return out


def _expected(estimate: dict, what: str, a: dict) -> None:
    """Where the 80 % interval of the comparable rows' errors would put this estimate's own figure (actual = estimate /
    (1 + error)), and, for tokens/s with a token budget, its device-hours and days (which scale as 1 / tokens/s)."""
    if "p10_error" not in a:
        return
    lo, hi = 1 + a["p10_error"], 1 + a["p90_error"]
    value = estimate[ESTIMATE_KEYS[what][0]]
    a["expected"] = [value / hi, value / lo]
    if what == "tokens/s/device" and "gpu_hours" in estimate:
        a["expected_gpu_hours"] = [estimate["gpu_hours"] * lo, estimate["gpu_hours"] * hi]
        a["expected_days"] = [estimate["days"] * lo, estimate["days"] * hi]


def _num(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def report_lines(acc: dict) -> list[str]:
    if "unavailable" in acc:
        return [f"accuracy   {acc['unavailable']}"]
    lines = []
    for what, a in acc.items():
        n = a["figures"]
        spread = (
            f"{a['min_error'] * 100:+.1f} %"
            if n == 1
            else f"{a['min_error'] * 100:+.1f} .. {a['max_error'] * 100:+.1f} %, median {a['median_error'] * 100:+.1f} %"
        )
        alike = {"similar": "one source, model, compile mode and layout kind", "any": "one source and device",
                 "memory": "one source, model, compile mode, layout kind and activation checkpointing"}  # fmt: skip
        on = (
            f"{what}, anchored: on {n} pair{'s' if n > 1 else ''} of published runs of {alike[a['anchored']]}, each"
            f" estimated as anchored on the other ({a['scope']})"
            if a.get("anchored")
            else f"{what}: on {n} published run{'s' if n > 1 else ''} ({a['scope']}"
            + (f"; none on the {a['part']}" if a.get("on_this_part") == 0 else "")
            + ")"
        )
        lines.append(
            f"{'accuracy' if not lines else '':<10} {on} estimate / published - 1 = {spread};"
            f" {a['within_goal']} within {a['goal'] * 100:.0f} %"
        )
        if "expected" in a:
            low, high = a["expected"]
            lines.append(
                f"{'':<10} an 80 % interval of those errors ({a['p10_error'] * 100:+.1f} .. {a['p90_error'] * 100:+.1f}"
                f" %) would put this plan at {_num(low)} .. {_num(high)} {ESTIMATE_KEYS[what][1]}"
                + (
                    f"; the run at {_num(a['expected_gpu_hours'][0])} .. {_num(a['expected_gpu_hours'][1])}"
                    f" device-hours, {a['expected_days'][0]:.1f} .. {a['expected_days'][1]:.1f} days"
                    if "expected_gpu_hours" in a
                    else ""
                )
            )
        if a.get("verdict_flipped_by"):
            ratio, fits = a["peak_over_capacity"], a["peak_over_capacity"] <= 1
            lines.append(
                f"{'':<10} the peak is {abs(ratio - 1) * 100:.1f} % {'below' if fits else 'above'} the memory the"
                " device leaves beside the CUDA context;"
                f" {a['verdict_flipped_by']} of these {n} runs' peaks were estimated {'low' if fits else 'high'} by"
                f" more: at their error this plan would {'not fit' if fits else 'fit'}"
            )
    return lines


def held_out_coverage(rows: list[dict]) -> dict[str, dict]:
    """How often the range an estimate prints held the published figure of a run it was not made from: for each
    row, the 80 % interval of the comparable rows' errors from the OTHER sources (as `comparable` picks them for the
    row's device family and layout kind), and whether the row's own error lies within it. Per quantity: `figures`
    (rows with at least RANGE_FIGURES comparable ones), `inside`, and `median_width` (the range's high / low - 1).
    docs/estimate.md, "Error bars held out"."""
    out: dict[str, dict] = {}
    for r in rows:
        if r["what"] not in ESTIMATE_KEYS or "device" not in r:
            continue
        others = [o for o in rows if o["source"] != r["source"]]
        a = comparable(others, family(r["device"]), r["layout"], r["what"])
        if a is None or "p10_error" not in a:
            continue
        c = out.setdefault(r["what"], {"figures": 0, "inside": 0, "widths": []})
        c["figures"] += 1
        c["inside"] += a["p10_error"] <= r["error"] <= a["p90_error"]
        c["widths"].append((1 + a["p90_error"]) / (1 + a["p10_error"]) - 1)
    for c in out.values():
        c["median_width"] = statistics.median(c.pop("widths"))
    return out
