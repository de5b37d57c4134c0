"""The one place where every reported number is computed (definitions: docs/metrics.md).

The trainer calls `record_step` after every optimizer step (cheap: adds to counters, no device sync) and the
processor, on log steps only, synchronizes the device, reduces across ranks, derives the metrics and hands one
dict to every sink. Throughput is measured over the interval since the previous log step, so the steady state
is what gets reported and no step pays for a sync it does not need.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import torch
import torch.distributed as dist

from torchtitan.host_sync import to_host

from .hardware import PeakFlops
from .memory import MemoryMonitor
from .sinks import JsonlSink, TensorBoardSink, format_line

# (metric key, short label, format) for the one aligned console line per log step.
CONSOLE_FIELDS = [
    ("loss/global_avg", "loss", "8.4f"),
    ("grad_norm", "gnorm", "7.3f"),
    ("lr", "lr", "9.2e"),
    ("throughput/tokens_per_sec_per_device", "tok/s/dev", "9,.0f"),
    ("throughput/tflops_per_device", "tflops", "7.2f"),
    ("mfu/percent", "mfu%", "6.2f"),
    ("mfu/percent_fp8_mixed", "mfu8%", "6.2f"),
    ("time/step_s", "step_s", "7.3f"),
    ("time/data_share_pct", "data%", "5.1f"),
    ("memory/max_reserved_gib", "mem_gib", "6.2f"),
    ("memory/max_rss_gib", "rss_gib", "6.2f"),
    ("progress/eta_s", "eta_s", "7.0f"),
]


def throughput_metrics(
    tokens_per_dp_rank: float,
    elapsed_s: float,
    non_dp_devices: int,
    dp_ranks_rate_sum: float,
    flops_per_token: float,
    peak: PeakFlops,
    float8_flops_per_token: float = 0.0,
) -> dict[str, float]:
    """Tokens/s, TFLOPS and MFU by the definitions in docs/metrics.md.

    tokens/s per device = tokens this data-parallel rank consumed / elapsed / (tp * pp * cp)
    MFU = flops_per_token * tokens/s per device / peak FLOPS of one device
    `dp_ranks_rate_sum` is the sum over data-parallel ranks of their tokens/s (the global figure).

    With float8 linears (float8_flops_per_token > 0 of the flops_per_token) and a known FP8 peak, also
    mfu/percent_fp8_mixed = ideal time / actual time, where the ideal time per token charges the float8 FLOPs
    to the FP8 peak and the rest to the BF16 peak:
        (f8 / peak_fp8 + (flops_per_token - f8) / peak_bf16) * tokens/s per device
    mfu/percent stays against the BF16 peak for every FLOP, so it remains comparable with bf16 runs.
    """
    per_device = tokens_per_dp_rank / elapsed_s / non_dp_devices
    tflops = flops_per_token * per_device / 1e12
    m = {
        "throughput/tokens_per_sec_per_device": per_device,
        "throughput/tokens_per_sec_global": dp_ranks_rate_sum,
        "throughput/tflops_per_device": tflops,
        "mfu/percent": 100.0 * tflops / peak.bf16_tflops,
    }
    if float8_flops_per_token > 0 and peak.fp8_tflops:
        ideal_s_per_token = (
            float8_flops_per_token / peak.fp8_tflops
            + (flops_per_token - float8_flops_per_token) / peak.bf16_tflops
        ) / 1e12
        m["mfu/percent_fp8_mixed"] = 100.0 * ideal_s_per_token * per_device
    return m


def _agree_on_peak(peak: PeakFlops) -> PeakFlops:
    """A measured peak differs a little per rank; use the highest everywhere so MFU is never flattered."""
    if not peak.source.startswith("measured") or dist.get_world_size() == 1:
        return peak
    best = torch.tensor([peak.bf16_tflops], dtype=torch.float64)
    dist.all_reduce(best, op=dist.ReduceOp.MAX)
    return dataclasses.replace(
        peak, bf16_tflops=best.item(), source=peak.source + f", max over {dist.get_world_size()} ranks"
    )


class MetricsProcessor:
    def __init__(
        self,
        *,
        cfg,
        dims,
        device: torch.device,
        rank: int,
        flops_per_token: float,
        peak: PeakFlops,
        tokens_per_step_per_dp_rank: int,
        dump_folder: str,
        start_step: int = 0,
        float8_flops_per_token: float = 0.0,
    ):
        self.cfg, self.dims, self.device, self.rank = cfg, dims, device, rank
        self.flops_per_token = flops_per_token
        self.float8_flops_per_token = float8_flops_per_token
        self.peak = _agree_on_peak(peak)
        self.tokens_per_step = tokens_per_step_per_dp_rank
        self.total_steps = cfg.training.steps
        self.memory = MemoryMonitor(device)
        self.sinks = []
        if rank == 0 and cfg.metrics.enable_tensorboard:
            # purge_step makes TensorBoard drop what an earlier run (or the pre-crash part of this one) logged at
            # steps >= the first step we are about to write, so resumed curves never zig-zag.
            self.sinks.append(TensorBoardSink(f"{dump_folder}/tb", purge_step=start_step + 1))
        if rank == 0 and cfg.metrics.enable_jsonl:
            self.sinks.append(JsonlSink(f"{dump_folder}/metrics.jsonl", purge_step=start_step + 1))
        self._reset_interval(start_step)

    def _reset_interval(self, step: int) -> None:
        self.interval_start = time.perf_counter()
        self.interval_first_step = step
        self.data_time = 0.0
        self.memory.reset_peak()

    def should_log(self, step: int) -> bool:
        return step == 1 or step % self.cfg.metrics.log_freq == 0 or step == self.total_steps

    def record_step(
        self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor, lr: float, data_time_s: float
    ) -> dict[str, float] | None:
        """Account one finished optimizer step; on log steps compute, emit and return the metrics."""
        self.data_time += data_time_s
        if not self.should_log(step):
            return None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        elapsed = now - self.interval_start
        steps = step - self.interval_first_step
        step_time = elapsed / steps

        # One all-reduce for the sums, one for the maxima (both over the dp mesh, so each replica counts once
        # even when tp/pp/cp peers share its batch), one all-gather of every rank's step time (stragglers).
        dp_mesh = self.dims.mesh("dp")
        local_rate = self.tokens_per_step * steps / elapsed
        loss_value = loss.detach().float()
        if self.dims.pp_enabled:
            # Only the last pipeline stage computes the loss; the other stages pass 0, so a sum over the pp mesh
            # gives every rank (rank 0 included, which logs) the value of its pipeline's last stage.
            dist.all_reduce(loss_value, op=dist.ReduceOp.SUM, group=self.dims.mesh("pp").get_group())
        if self.dims.cp_enabled:
            # Under context parallel each cp rank holds the loss of its share of the sequence: add them up.
            dist.all_reduce(loss_value, op=dist.ReduceOp.SUM, group=self.dims.mesh("cp").get_group())
        loss_value, grad_norm_value = to_host(loss_value, grad_norm)  # the log step's one device read
        sums = torch.tensor([loss_value, local_rate], dtype=torch.float64)
        maxes = torch.tensor([loss_value], dtype=torch.float64)
        dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=dp_mesh.get_group())
        dist.all_reduce(maxes, op=dist.ReduceOp.MAX, group=dp_mesh.get_group())
        step_times = [None] * dist.get_world_size()
        dist.all_gather_object(step_times, step_time)

        m: dict[str, float] = {
            "loss/global_avg": sums[0].item() / self.dims.dp,
            "loss/global_max": maxes[0].item(),
            "grad_norm": grad_norm_value,
            "lr": lr,
        }
        m.update(
            throughput_metrics(
                self.tokens_per_step * steps,
                elapsed,
                self.dims.non_data_parallel_size,
                sums[1].item(),
                self.flops_per_token,
                self.peak,
                self.float8_flops_per_token,
            )
        )
        m.update(
            {
                "time/step_s": step_time,
                "time/step_s_min_rank": min(step_times),
                "time/step_s_median_rank": statistics.median(step_times),
                "time/step_s_max_rank": max(step_times),
                "time/data_s": self.data_time / steps,
                "time/data_share_pct": 100.0 * self.data_time / elapsed,
                "progress/tokens_seen": float(step * self.tokens_per_step * self.dims.dp),
                "progress/eta_s": (self.total_steps - step) * step_time,
            }
        )
        m.update(self.memory.snapshot())
        if self.rank == 0:
            for sink in self.sinks:
                sink.write(step, m)
        self.last_line = format_line(step, m, CONSOLE_FIELDS)
        self._reset_interval(step)
        return m

    def float8_header(self) -> str:
        """Run-header line saying how MFU is reported when float8 linears are on."""
        share = 100.0 * self.float8_flops_per_token / self.flops_per_token
        line = (
            f"float8: {share:.1f}% of flops/token in float8 linears; mfu% charges all FLOPs to the BF16 peak"
        )
        if self.peak.fp8_tflops:
            return (
                line
                + f"; mfu8% (mfu/percent_fp8_mixed) charges them to the FP8 peak {self.peak.fp8_tflops:g} TF"
            )
        return line + "; no FP8 peak known for this device, so no mixed FP8/BF16 MFU"

    def write_text(self, tag: str, text: str) -> None:
        for sink in self.sinks:
            if hasattr(sink, "write_text"):
                sink.write_text(tag, text)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
