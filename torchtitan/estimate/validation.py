"""The estimator against published runs: read tests/estimate_reference.toml, estimate every row, report errors,
in-sample and cross-validated (leave one source out).

Shared by tests/test_estimate_validation.py (the goals) and scripts/estimate_validation.py (the tables in
docs/estimate.md), so both evaluate exactly the same configurations.

Cross-validation: a constant listed in FITTED (an Efficiency field -> candidate values) would be chosen on the
reference rows by minimising the median absolute error. For each source (one published table) `cross_validated`
chooses every fitted constant on the rows of the OTHER sources only and reports that source's rows with them;
the goal applies to these errors. FITTED is empty: every rate comes from a published microbenchmark, a datasheet or
a stated physical rule (rates.py, efficiency.py), so each source's cross-validated errors equal the in-sample
ones -- `cross_validated` still runs the procedure and the test checks both that claim and the procedure on a
non-empty FITTED.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from pathlib import Path

from torchtitan.config import parse_args
from torchtitan.models import model_args_from_config

from .efficiency import DEFAULT, Efficiency
from .inference import estimate_inference
from .plan import Calibration, build_plan, resolve_hardware
from .training import estimate_plan

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REFERENCE = Path(__file__).resolve().parents[2] / "tests" / "estimate_reference.toml"

# Constants chosen on the reference rows (Efficiency field -> candidate values). Empty: none is.
FITTED: dict[str, tuple[float, ...]] = {}


def load_reference(path: Path = REFERENCE) -> dict:
    return tomllib.loads(Path(path).read_text())


def training_cfg(ref: dict, row: dict):
    argv = list(row["args"])
    for key, value in ref["parts"].get(row.get("part", ""), {}).items():
        argv.append(f"--estimate.{key}={value}")
    argv.append(f"--estimate.num_devices={row['num_devices']}")
    argv += [*ref.get("source_estimate_args", {}).get(row["source"], []), *row.get("estimate_args", [])]
    if "total_tokens" in row:
        argv.append(f"--estimate.total_tokens={row['total_tokens']}")
    return parse_args(argv)


def training_estimate(ref: dict, row: dict, eff: Efficiency = DEFAULT) -> dict:
    return estimate_plan(build_plan(training_cfg(ref, row), eff=eff))


def inference_estimate(ref: dict, row: dict, eff: Efficiency = DEFAULT) -> dict:
    cfg = parse_args([*row["args"], *ref["inference_common"]["estimate_args"], *row["estimate_args"]])
    e = cfg.estimate
    args = model_args_from_config(cfg.model, cfg.training.seq_len)
    tp = cfg.parallelism.tensor_parallel_degree
    return estimate_inference(
        args, resolve_hardware(e), e.batch_size, e.prompt_len, e.gen_len, e.weight_dtype, tp, eff=eff
    )


def stored_calibration(cal: dict) -> Calibration:
    c = Calibration(**{k: v for k, v in cal.items() if k != "matmul_tflops"})
    c.matmul_tflops = {tuple(x[:3]): x[3] for x in cal["matmul_tflops"]}
    return c


def cpu_estimate(row: dict, eff: Efficiency = DEFAULT) -> dict:
    """The estimate for a CPU row from the calibration stored with it (measured on the same machine)."""
    cfg = parse_args(
        [*row["args"], "--estimate.hardware=cpu", f"--estimate.num_devices={row['num_devices']}"]
    )
    return estimate_plan(build_plan(cfg, stored_calibration(row["calibration"]), eff=eff))


# quantity compared -> (published key in the row, estimate key, goal on |error|)
TRAINING_QUANTITIES = {
    "tokens/s/device": ("tokens_per_sec", "tokens_per_sec_per_device", 0.15),
    "memory GiB": ("memory_gib", "memory_gib", 0.10),
    "TFLOPS/device": ("tflops_per_device", "tflops_per_device", 0.15),
    "GPU-hours": ("gpu_hours", "gpu_hours", 0.25),
}


def table(ref: dict | None = None, eff: Efficiency = DEFAULT, sources: set[str] | None = None) -> list[dict]:
    """Every row (of `sources`, default all): what is compared, published and estimated values, relative error."""
    ref = ref or load_reference()
    out = []

    def keep(row: dict) -> bool:
        return sources is None or row["source"] in sources

    for row in filter(keep, ref["training"]):
        r = training_estimate(ref, row, eff)
        for what, (pub, est, goal) in TRAINING_QUANTITIES.items():
            if pub in row:
                out.append(dict(id=row["id"], source=row["source"], what=what, published=row[pub],
                                estimated=r[est], goal=goal, **device_and_layout(r)))  # fmt: skip
    for row in filter(keep, ref["inference"]):
        r = inference_estimate(ref, row, eff)
        out.append(dict(id=row["id"], source=row["source"], what="decode tokens/s", published=row["tokens_per_sec"],
                        estimated=r["tokens_per_sec"], goal=0.15, **device_and_layout(r)))  # fmt: skip
    for row in filter(keep, ref["cpu"]):
        r = cpu_estimate(row, eff)
        out.append(dict(id=row["id"], source=row["source"], what="step time s", published=row["step_time_s"],
                        estimated=r["step_time_s"], goal=0.15, **device_and_layout(r)))  # fmt: skip
        out.append(dict(id=row["id"], source=row["source"], what="max RSS GiB", published=row["max_rss_gib"],
                        estimated=r["memory_gib"], goal=0.10, **device_and_layout(r)))  # fmt: skip
    for x in out:
        x["error"] = x["estimated"] / x["published"] - 1
    return out


def layout_kind(layout: dict, num_devices: int) -> str:
    """The kind of layout a training row or estimate has, the first that applies: one device, pipeline parallel,
    context parallel, tensor parallel, data parallel (FSDP / HSDP)."""
    if num_devices == 1:
        return "one device"
    for dim, kind in (("pp", "pipeline parallel"), ("cp", "context parallel"), ("tp", "tensor parallel")):
        if layout.get(dim, 1) > 1:
            return kind
    return "data parallel"


def device_and_layout(estimate: dict) -> dict:
    """The device (hardware-table name) and layout kind of a training or inference estimate: what a table row is
    compared by (accuracy.py). An inference estimate's layout is one device or tensor parallel."""
    if estimate["mode"] == "inference":
        return {
            "device": estimate["hardware"],
            "layout": "tensor parallel" if estimate["tp"] > 1 else "one device",
        }
    hw = estimate["hardware"]
    return {"device": hw["name"], "layout": layout_kind(estimate["layout"], hw["num_devices"])}


def sources(ref: dict) -> list[str]:
    rows = ref["training"] + ref["inference"] + ref["cpu"]
    return sorted({r["source"] for r in rows})


def median_abs_error(rows: list[dict]) -> float:
    return statistics.median(abs(x["error"]) for x in rows) if rows else 0.0


def fit(ref: dict, exclude: str | None, fitted: dict[str, tuple[float, ...]] | None = None) -> Efficiency:
    """The Efficiency whose `fitted` constants minimise the median absolute error over every row whose source is
    not `exclude` (a grid search, one constant at a time in the listed order); DEFAULT when nothing is fitted."""
    fitted = FITTED if fitted is None else fitted
    eff = DEFAULT
    if not fitted:
        return eff
    train = set(sources(ref)) - {exclude}
    for name, grid in fitted.items():
        scored = [
            (median_abs_error(table(ref, dataclasses.replace(eff, **{name: v}), train)), v) for v in grid
        ]
        eff = dataclasses.replace(eff, **{name: min(scored)[1]})
    return eff


def cross_validated(
    ref: dict | None = None, fitted: dict[str, tuple[float, ...]] | None = None
) -> list[dict]:
    """Each source's rows estimated with the constants fitted without that source (leave one source out)."""
    ref = ref or load_reference()
    out = []
    for s in sources(ref):
        eff = fit(ref, s, fitted)
        rows = table(ref, eff, {s})
        for x in rows:
            x["fitted"] = {k: getattr(eff, k) for k in (FITTED if fitted is None else fitted)}
        out += rows
    return out
