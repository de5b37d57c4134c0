"""python -m torchtitan.estimate: plan a run from its training config, without a GPU or a process group.

    python -m torchtitan.estimate --job.config_file train_configs/llama3_70b.toml \\
        --estimate.hardware h100-sxm --estimate.num_devices 256 [--estimate.total_tokens 15e12] [--estimate.json out.json]
    python -m torchtitan.estimate ... --estimate.search=true          # rank every fitting layout, fastest first
    python -m torchtitan.estimate ... --estimate.calibrate=true       # measure this machine's devices first
    python -m torchtitan.estimate ... --estimate.anchor=RUN_FOLDER    # scale by a run measured on this cluster
    python -m torchtitan.estimate ... --estimate.anchor=torchtitan.log  # ... or by a torchtitan run's log
    python -m torchtitan.estimate ... --estimate.accuracy=false       # skip the comparable published runs' errors
    python -m torchtitan.estimate --model.flavor 8B --estimate.mode inference --estimate.hardware a100 \\
        --estimate.batch_size 1 --estimate.prompt_len 128 --estimate.gen_len 256 --estimate.weight_dtype int8

Every training override applies ([parallelism], [training], [activation_checkpoint], [compile], [float8], the
[model] shape fields ...); the [estimate] section chooses the hardware and what to estimate. docs/estimate.md
describes the model, its defaults and its validation against published runs. Exit code 0, or 2 with one line
naming the bad key or value.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from torchtitan.config import help_text, parse_args, validate
from torchtitan.errors import UserError


def _calibration_json(cal) -> dict:
    d = dataclasses.asdict(cal)
    d["matmul_tflops"] = [[*shape, tf] for shape, tf in sorted(cal.matmul_tflops.items())]
    return d


def _calibration_line(cal) -> str:
    """What a calibration measured, in one line (an inference calibration has no attention, loss or block)."""
    parts = [f"square-GEMM peak {cal.matmul_peak_tflops:.3f} TFLOPS"]
    if cal.attention_tflops is not None:
        parts.append(f"attention {cal.attention_tflops:.3f} TFLOPS")
    parts.append(f"memory {cal.hbm_gbps:.1f} GB/s")
    if cal.decode_gbps is not None:
        parts.append(f"decode matmuls {cal.decode_gbps:.1f} GB/s")
    if cal.decode_step_s:
        steps = ", ".join(
            f"{t * 1e3:.2f} ms with {d} block{'s' if d > 1 else ''}" for d, t in cal.decode_step_s
        )
        parts.append(f"a decode step {steps}")
    if cal.prefill_s:
        parts.append("the prefill " + ", ".join(f"{t * 1e3:.1f} ms with {d}" for d, t in cal.prefill_s))
    if cal.loss_ns_per_logit is not None:
        parts.append(f"eager loss {cal.loss_ns_per_logit:.2f} ns/logit")
    if cal.collective_gbps:
        parts.append(f"collectives {cal.collective_gbps:.2f} GB/s")
    if cal.block_s:
        parts.append(
            f"one block {cal.block_s * 1e3:.1f} ms ({cal.block_kernels_s * 1e3:.1f} in its GEMMs and attention alone)"
        )
    return f"{'; '.join(cal.notes)}: {', '.join(parts)}"


def run(cfg, out=None, argv: list[str] | None = None) -> dict:
    """Estimate what the config's [estimate] section asks for; print the report to `out`; return the JSON dict."""
    from torchtitan.models import model_args_from_config

    from .inference import estimate_inference, inference_hardware
    from .plan import build_plan
    from .report import inference_report, search_report, training_report
    from .search import search
    from .training import estimate_plan

    out = out or sys.stdout
    est = cfg.estimate
    if est.search_top < 1:
        raise UserError(f"estimate.search_top = {est.search_top} must be >= 1")
    if est.anchor:
        from . import anchor

        anchor.check_plan(est)  # before any calibration: a plan it cannot anchor is refused at once
    calibration = None
    if est.calibrate:
        from .calibrate import calibrate, calibrate_inference

        if est.mode == "inference":  # the rates generation reads, not the training plan's step
            from torchtitan.models import model_args_from_config

            calibration = calibrate_inference(
                model_args_from_config(cfg.model, cfg.training.seq_len), est.batch_size,
                cfg.parallelism.tensor_parallel_degree, est.prompt_len, est.gen_len, est.weight_dtype,
                compile=cfg.compile.enable, cpu_bf16_fp32_kernels=cfg.training.cpu_bf16_fp32_kernels,
            )  # fmt: skip
        else:
            calibration = calibrate(build_plan(cfg, require_rates=False), config_argv=argv)
        print(f"calibrated: {_calibration_line(calibration)}", file=out)
    if est.mode == "inference":
        args = model_args_from_config(cfg.model, cfg.training.seq_len)
        hw = inference_hardware(est, cfg.parallelism.tensor_parallel_degree, calibration)
        result = estimate_inference(
            args, hw, est.batch_size, est.prompt_len, est.gen_len, est.weight_dtype,
            cfg.parallelism.tensor_parallel_degree, measured_decode_gbps=calibration.decode_gbps if calibration else None,
            measured_decode_step=calibration.decode_step_s if calibration else None,
            measured_prefill=calibration.prefill_s if calibration else None,
        )  # fmt: skip
        text = inference_report(result)
    elif est.search:
        results = search(cfg, calibration)
        shown = results[: est.search_top]
        if est.accuracy and shown:  # each shown layout's comparable errors (its column "at risk")
            from .accuracy import accuracy_of, rows_for

            rows = rows_for(shown[0])
            for r in shown:
                r["validation"] = accuracy_of(r, rows)
        text = search_report(results, est.search_top)
        result = {"mode": "search", "fitting_layouts": len(results), "layouts": shown}
    else:
        result = estimate_plan(build_plan(cfg, calibration))
        text = training_report(result)
        if est.anchor:  # scaled by a measured run of the same cluster (anchor.py)
            anchor.anchor_estimate(cfg, calibration, result)
            text = "\n".join([training_report(result), *anchor.report_lines(result["anchor"])])
    # the comparable published runs' errors: for a search, those of its best layout's kind
    best = result if result["mode"] != "search" else (result["layouts"] or [None])[0]
    if est.accuracy and best is not None:
        from .accuracy import accuracy_of, report_lines

        result["validation"] = best.get("validation") or accuracy_of(best)
        text = "\n".join([text, *report_lines(result["validation"])])
    if calibration is not None:
        result["calibration"] = _calibration_json(calibration)
    print(text, file=out)
    if est.json:
        try:
            with open(est.json, "w") as f:
                json.dump(result, f, indent=2)
        except OSError as e:
            raise UserError(f"estimate.json {est.json}: cannot write: {e.strerror}") from None
        print(f"written: {est.json}", file=out)
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--help" in argv or "-h" in argv:
        print(__doc__)
        print(help_text())
        return 0
    try:
        cfg = parse_args(argv)
        validate(cfg)
        run(cfg, argv=argv)
        return 0
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
