"""The run header: what this run is (model, layout, batch, FLOPs convention, MFU peak, startup), logged once
before the first step and written to TensorBoard as the text `run/header`."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from torchtitan.log import logger
from torchtitan.metrics import MetricsProcessor, cpu_bf16_warning

if TYPE_CHECKING:
    from torchtitan.build import Run


def log_run_header(
    run: Run, metrics: MetricsProcessor, load_from: str | None, init_s: float, optim_s: float, started: float
) -> None:
    """`load_from`: the checkpoint the weights came from (None: initialized in `init_s` seconds); `optim_s`: the
    optimizer state's allocation; `started`: time.perf_counter() at the start of train()."""
    cfg, dims, t = run.cfg, run.dims, run.cfg.training
    header = [run.sim.header()] if run.sim else []
    header += [
        f"model {cfg.model.name} {cfg.model.flavor}: {run.model_args.num_params():,} parameters"
        f" ({run.model_args.num_flop_params():,} in matmuls), {run.world_size} x {run.device.type}",
        f"parallelism: {dims.describe()}",
        f"batch: {t.local_batch_size} x {t.seq_len} tokens per dp rank and micro-step, {dims.dp} dp ranks,"
        f" {run.accum_steps} micro-steps, {run.global_tokens:,} tokens per step, {t.steps} steps",
        f"flops/token: {run.flops_per_token:,.0f} ("
        + ("causal attention halved" if cfg.metrics.causal_flops else "full attention, 6N + 12*L*H*D*S")
        + ")",
        f"MFU peak: {metrics.peak.bf16_tflops:.2f} TFLOPS per device from {metrics.peak.source}",
        "startup: "
        + (f"weights loaded from {load_from}" if load_from else f"weights initialized in {init_s:.2f} s")
        + f", optimizer state allocated in {optim_s:.2f} s, {time.perf_counter() - started:.1f} s since start",
    ]
    if run.env_defaults:
        header.append("environment defaults: " + " ".join(f"{k}={v}" for k, v in run.env_defaults.items()))
    if run.fp8_flops_per_token:
        header.append(metrics.float8_header())
    for line in header:
        logger.info(line)
    metrics.write_text("run/header", "\n\n".join(header))
    fp32_kernels = run.kernel_dtype != run.compute_dtype
    if note := cpu_bf16_warning(run.device, run.compute_dtype, fp32_kernels=fp32_kernels):
        logger.warning(note)
