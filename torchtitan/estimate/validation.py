"""The estimator against published runs: read tests/estimate_reference.toml, estimate every row, report errors.

Shared by tests/test_estimate_validation.py (the goals) and scripts/estimate_validation.py (the table in
docs/estimate.md), so both evaluate exactly the same configurations.
"""

from __future__ import annotations

import sys
from pathlib import Path

from torchtitan.config import parse_args
from torchtitan.models import model_args_from_config

from .inference import estimate_inference
from .plan import Calibration, build_plan, resolve_hardware
from .training import estimate_plan

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REFERENCE = Path(__file__).resolve().parents[2] / "tests" / "estimate_reference.toml"


def load_reference(path: Path = REFERENCE) -> dict:
    return tomllib.loads(Path(path).read_text())


def training_cfg(ref: dict, row: dict):
    argv = list(row["args"])
    for key, value in ref["parts"].get(row.get("part", ""), {}).items():
        argv.append(f"--estimate.{key}={value}")
    argv += [f"--estimate.num_devices={row['num_devices']}", *row.get("estimate_args", [])]
    return parse_args(argv)


def training_estimate(ref: dict, row: dict) -> dict:
    return estimate_plan(build_plan(training_cfg(ref, row)))


def inference_estimate(ref: dict, row: dict) -> dict:
    cfg = parse_args([*row["args"], *ref["inference_common"]["estimate_args"], *row["estimate_args"]])
    e = cfg.estimate
    args = model_args_from_config(cfg.model, cfg.training.seq_len)
    tp = cfg.parallelism.tensor_parallel_degree
    return estimate_inference(
        args, resolve_hardware(e), e.batch_size, e.prompt_len, e.gen_len, e.weight_dtype, tp
    )


def stored_calibration(cal: dict) -> Calibration:
    c = Calibration(**{k: v for k, v in cal.items() if k != "matmul_tflops"})
    c.matmul_tflops = {tuple(x[:3]): x[3] for x in cal["matmul_tflops"]}
    return c


def cpu_estimate(row: dict) -> dict:
    """The estimate for a CPU row from the calibration stored with it (measured on the same machine)."""
    cfg = parse_args(
        [*row["args"], "--estimate.hardware=cpu", f"--estimate.num_devices={row['num_devices']}"]
    )
    return estimate_plan(build_plan(cfg, stored_calibration(row["calibration"])))


def table(ref: dict | None = None) -> list[dict]:
    """Every row: what is compared, published and estimated values, relative error."""
    ref = ref or load_reference()
    out = []
    for row in ref["training"]:
        r = training_estimate(ref, row)
        out.append(dict(id=row["id"], what="tokens/s/device", published=row["tokens_per_sec"],
                        estimated=r["tokens_per_sec_per_device"]))  # fmt: skip
        out.append(
            dict(id=row["id"], what="memory GiB", published=row["memory_gib"], estimated=r["memory_gib"])
        )
    for row in ref["inference"]:
        r = inference_estimate(ref, row)
        out.append(dict(id=row["id"], what="decode tokens/s", published=row["tokens_per_sec"],
                        estimated=r["tokens_per_sec"]))  # fmt: skip
    for row in ref["cpu"]:
        r = cpu_estimate(row)
        out.append(
            dict(id=row["id"], what="step time s", published=row["step_time_s"], estimated=r["step_time_s"])
        )
        out.append(
            dict(id=row["id"], what="max RSS GiB", published=row["max_rss_gib"], estimated=r["memory_gib"])
        )
    for x in out:
        x["error"] = x["estimated"] / x["published"] - 1
    return out
