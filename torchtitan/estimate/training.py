"""The training estimate: memory, step time, tokens/s, MFU and GPU-hours of one configuration."""

from __future__ import annotations

import copy

from torchtitan.metrics.hardware import PeakFlops
from torchtitan.metrics.processor import throughput_metrics

from . import collectives, rates
from .efficiency import DEFAULT, Efficiency
from .memory import training_memory
from .plan import Calibration, Plan, build_plan
from .steptime import training_step_time


def float8_flops_per_token(plan: Plan) -> float:
    """FLOPs/token of the float8-converted linears (6 * in * out each, as quantize.float8_flops_per_token)."""
    if not plan.float8:
        return 0.0
    per_block = sum(6 * lin.in_features * lin.out_features for lin in plan.block_linears if lin.float8)
    head = 6 * plan.head.in_features * plan.head.out_features if plan.head.float8 else 0
    return per_block * plan.args.n_layers + head


# Options of this trainer the estimate does not price: option -> what is left out and how far off it was measured.
NOT_PRICED = {
    "parallelism.fsdp_cpu_offload": (
        "the host-device copies of each all-gather's sharded fp32 parameters and each reduce-scatter's gradients"
        " (FSDP2's CPUOffloadPolicy), the AdamW step and gradient clipping on the CPU, and the device copies"
        " staged for them: the step time is a lower bound and the peak memory may be low (Llama 3.2 1B shape on one"
        " H200 at 1 x 2048: 6,066 tokens/s and 19.3 GiB reserved measured, 46,589 and 9.3 GiB estimated;"
        " docs/performance.md)"
    ),
}


def not_priced(plan: Plan) -> list[str]:
    """The options of this configuration the estimate leaves out (NOT_PRICED), each with what that misses."""
    chosen = {"parallelism.fsdp_cpu_offload": plan.cfg.parallelism.fsdp_cpu_offload}
    return [f"{k}: {NOT_PRICED[k]}" for k, on in chosen.items() if on]


def estimate_plan(plan: Plan) -> dict:
    """Every training figure of a resolved plan (the JSON keys of docs/estimate.md)."""
    cfg, dims = plan.cfg, plan.dims
    mem = training_memory(plan)
    t = training_step_time(plan)
    step = t["step_time_s"]
    tokens_per_dp_rank = plan.accum * plan.local_batch * plan.seq_len
    flops_per_token = plan.args.flops_per_token(plan.seq_len, causal=cfg.metrics.causal_flops)
    peak = PeakFlops(plan.hw.bf16_tflops, plan.hw.fp8_tflops, plan.hw.source, plan.hw.name)
    per_dp = tokens_per_dp_rank / step
    m = throughput_metrics(
        tokens_per_dp_rank, step, dims.non_data_parallel_size, per_dp * dims.dp, flops_per_token, peak,
        float8_flops_per_token(plan),
    )  # fmt: skip
    out = {
        "mode": "training",
        "model": {
            "name": cfg.model.name,
            "flavor": cfg.model.flavor,
            "params": plan.args.num_params(),
            "flop_params": plan.args.num_flop_params(),
        },
        "hardware": {
            "name": plan.hw.name,
            "source": plan.hw.source,
            "num_devices": dims.world_size,
            "devices_per_node": plan.hw.devices_per_node,
            # "mesh": each GPU of a node linked straight to each peer, no switch (collectives.is_mesh)
            "intra_node_topology": "mesh" if collectives.is_mesh(plan) else "switch",
            "bf16_tflops": plan.hw.bf16_tflops,
            "fp8_tflops": plan.hw.fp8_tflops,
            "memory_gib": plan.hw.memory_gib,
            "hbm_gbps": plan.hw.hbm_gbps,
            "intra_node_gbps": plan.hw.intra_node_gbps,
            "inter_node_gbps": plan.hw.inter_node_gbps,
            # the power limit the table's compute rates stand for (None: measured rates, a calibration's or a CPU's)
            "compute_power_w": None
            if plan.calibration is not None
            else rates.compute_power_w(plan.hw.name, plan.hw.power_limit_w),
            "sm_clock_mhz": plan.hw.sm_clock_mhz,  # locked below boost (None: free to boost)
            "calibrated": plan.calibration is not None,
        },
        "layout": {
            "dp_replicate": dims.dp_replicate,
            "dp_shard": dims.dp_shard,
            "cp": dims.cp,
            "tp": dims.tp,
            "pp": dims.pp,
            "pp_schedule": plan.pp_plan.schedule if plan.pp_plan else None,
            "pp_microbatches": plan.n_microbatches if plan.pp_plan else None,
            "local_batch_size": plan.local_batch,
            "seq_len": plan.seq_len,
            "grad_accumulation_steps": plan.accum,
            "ac_mode": cfg.activation_checkpoint.mode
            + (
                f":{cfg.activation_checkpoint.selective_ac_option}"
                if cfg.activation_checkpoint.mode == "selective"
                else ""
            ),
            "compile": [
                c for c in ("model", "loss") if (plan.compile_model if c == "model" else plan.compile_loss)
            ],
            "float8": plan.float8,
        },
        "fits": mem["fits"],
        "memory_over_usable": mem["memory_over_usable"],
        "memory_gib": mem["memory_gib"],
        "memory_breakdown_gib": mem["memory_breakdown_gib"],
        "peak_pipeline_rank": mem["peak_pipeline_rank"],
        "memory_by_pipeline_rank_gib": mem["memory_by_pipeline_rank_gib"],
        "step_time_s": step,
        "step_time_breakdown_s": t["step_time_breakdown_s"],
        "compute_detail_s": t["compute_detail_s"],
        "tokens_per_step": tokens_per_dp_rank * dims.dp,
        "tokens_per_sec_per_device": m["throughput/tokens_per_sec_per_device"],
        "tokens_per_sec_global": m["throughput/tokens_per_sec_global"],
        "tflops_per_device": m["throughput/tflops_per_device"],
        "flops_per_token": flops_per_token,
        "mfu_percent": m["mfu/percent"],
    }
    if "mfu/percent_fp8_mixed" in m:
        out["mfu_percent_fp8_mixed"] = m["mfu/percent_fp8_mixed"]
    if missing := not_priced(plan):
        out["not_priced"] = missing
    total = cfg.estimate.total_tokens
    if total is not None:
        # wall clock = productive step time / goodput (restarts, re-done steps, saves, validation, init)
        tps = out["tokens_per_sec_per_device"] * cfg.estimate.goodput_percent / 100
        out["total_tokens"] = total
        out["goodput_percent"] = cfg.estimate.goodput_percent
        out["gpu_hours"] = total / tps / 3600
        out["days"] = total / (tps * dims.world_size) / 86400
    return out


def estimate_training(cfg, calibration: Calibration | None = None, eff: Efficiency = DEFAULT) -> dict:
    """Estimate a training run described by a JobConfig (its [estimate] section gives hardware and devices)."""
    return estimate_plan(build_plan(cfg, calibration, eff))


def estimate_memory(cfg, world_size: int) -> dict:
    """Peak memory per device only (no timing, no calibration) on the device this machine has: its CUDA table
    entry (memory as reported by the device), or the CPU. Used by the preflight."""
    import torch

    from torchtitan.metrics.hardware import match_device

    c = copy.deepcopy(cfg)
    c.estimate.num_devices = world_size
    if torch.cuda.is_available():
        c.estimate.hardware = match_device(torch.cuda.get_device_name()) or "h100-sxm"
        c.estimate.memory_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    else:
        c.estimate.hardware = "cpu"
    return training_memory(build_plan(c, require_rates=False))
