"""The one place where every reported number is computed (definitions: docs/metrics.md).

The trainer calls `record_step` after every optimizer step (cheap: adds to counters, no device sync) and the
processor, on log steps only, synchronizes the device, reduces across ranks, derives the metrics and hands one
dict to every sink. Throughput is measured over the interval since the previous log step, so the steady state
is what gets reported and no step pays for a sync it does not need. Validation results (`record_validation`)
and the goodput counters (metrics/goodput.py) become metrics here too; each has its own short console line.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time

import torch
import torch.distributed as dist

from torchtitan.host_sync import to_host
from torchtitan.log import logger

from .goodput import PARTS, GoodputTracker
from .hardware import PeakFlops
from .memory import MemoryMonitor
from .sinks import JsonlSink, TensorBoardSink, WandbSink, format_line

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
        "mfu/percent": 100.0 * (tflops / peak.bf16_tflops),  # exactly 100 when the rate is the peak
    }
    if float8_flops_per_token > 0 and peak.fp8_tflops:
        ideal_s_per_token = (
            float8_flops_per_token / peak.fp8_tflops
            + (flops_per_token - float8_flops_per_token) / peak.bf16_tflops
        ) / 1e12
        m["mfu/percent_fp8_mixed"] = 100.0 * ideal_s_per_token * per_device
    return m


def straggler_metrics(step_s: list[float], data_s: list[float]) -> dict[str, float]:
    """The slowest rank and its step and data time next to the median (lists indexed by global rank).

    In synchronous training every rank waits in the collectives for the slowest one, so their step times end up
    nearly equal and the straggler shows in the time it spends before a collective, chiefly its data wait. A
    rank's factor is therefore the larger of  step_s / median step_s  and  1 + (data_s - median data_s) /
    median step_s  (how much its extra data wait stretches everybody's step); the slowest rank has the largest.
    """
    med_step, med_data = statistics.median(step_s), statistics.median(data_s)

    def factor(r: int) -> float:
        if med_step <= 0:
            return 1.0
        return max(step_s[r] / med_step, 1.0 + (data_s[r] - med_data) / med_step)

    slow = max(range(len(step_s)), key=factor)
    return {
        "stragglers/slowest_rank": float(slow),
        "stragglers/factor": factor(slow),
        "stragglers/slowest_step_s": step_s[slow],
        "stragglers/median_step_s": med_step,
        "stragglers/fastest_step_s": min(step_s),
        "stragglers/slowest_data_s": data_s[slow],
        "stragglers/median_data_s": med_data,
    }


def straggler_warning(m: dict[str, float], threshold: float, first_step: int, last_step: int) -> str | None:
    """The warning line when the slowest rank's factor exceeds metrics.straggler_factor, else None."""
    if m["stragglers/factor"] <= threshold:
        return None
    return (
        f"straggler: rank {int(m['stragglers/slowest_rank'])} is {m['stragglers/factor']:.2f}x the median"
        f" (metrics.straggler_factor {threshold:g}) over steps {first_step}-{last_step}:"
        f" step {m['stragglers/slowest_step_s']:.3f} s vs median {m['stragglers/median_step_s']:.3f} s,"
        f" data wait {m['stragglers/slowest_data_s']:.3f} s vs median {m['stragglers/median_data_s']:.3f} s"
    )


def goodput_metrics(snapshot: dict) -> dict[str, float]:
    """goodput/percent = 100 * productive / wall, and every part in seconds (docs/metrics.md, "Goodput")."""
    wall = snapshot["wall_s"]
    m = {"goodput/percent": 100.0 * snapshot["parts"]["productive"] / wall if wall > 0 else 0.0}
    m["goodput/wall_s"] = wall
    m.update({f"goodput/{part}_s": snapshot["parts"][part] for part in PARTS})
    m["goodput/lost_steps"] = float(snapshot["lost_steps"])
    m["goodput/restarts"] = float(snapshot["restarts"])
    return m


def goodput_line(step: int, m: dict[str, float]) -> str:
    parts = "  ".join(f"{p} {m[f'goodput/{p}_s']:.1f}" for p in PARTS if m[f"goodput/{p}_s"] >= 0.05)
    return f"goodput    {step:>6d}  {m['goodput/percent']:5.1f}% of {m['goodput/wall_s']:.1f} s  ({parts} s)"


def validation_metrics(loss_sum: float, tokens: int) -> dict[str, float]:
    """validation/loss = token cross-entropy summed over the validation set / its tokens; perplexity = e^loss."""
    loss = loss_sum / tokens
    return {
        "validation/loss": loss,
        "validation/perplexity": math.exp(loss) if loss < 700 else float("inf"),
    }


def _agree_on_peak(peak: PeakFlops) -> PeakFlops:
    """A measured peak differs a little per rank; use the highest everywhere so MFU is never flattered."""
    if not peak.measured or dist.get_world_size() == 1:
        return peak
    best = torch.tensor([peak.bf16_tflops], dtype=torch.float64)
    dist.all_reduce(best, op=dist.ReduceOp.MAX)
    return dataclasses.replace(
        peak, bf16_tflops=best.item(), source=peak.source + f", max over {dist.get_world_size()} ranks"
    )


def raise_measured_peak(peak: PeakFlops, achieved_tflops: float, step: int) -> tuple[PeakFlops, str | None]:
    """A measured peak is only a lower bound of what the device can do: if a rank ran the model faster than
    the calibration measured (the machine was busier while it measured), the achieved rate becomes the peak, so
    MFU never reads above 100 %. Returns the peak to use from now on and the warning to log, if it changed.
    A table or override peak is never changed: exceeding it means a wrong datasheet value or FLOPs count."""
    if not peak.measured or achieved_tflops <= peak.bf16_tflops:
        return peak, None
    warning = (
        f"MFU peak raised from {peak.bf16_tflops:.4g} to {achieved_tflops:.4g} TFLOPS per device at step {step}:"
        f" a rank ran faster than the start-up calibration measured (usually: the machine was busier while it"
        f" measured);"
        f" earlier MFU values were against the lower peak. Set metrics.peak_tflops to fix the reference"
    )
    raised = dataclasses.replace(
        peak,
        bf16_tflops=achieved_tflops,
        source=peak.source + f", raised to the rate achieved by step {step}",
    )
    return raised, warning


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
        goodput: GoodputTracker | None = None,
    ):
        self.cfg, self.dims, self.device, self.rank = cfg, dims, device, rank
        self.flops_per_token = flops_per_token
        self.float8_flops_per_token = float8_flops_per_token
        self.peak = _agree_on_peak(peak)
        self.tokens_per_step = tokens_per_step_per_dp_rank
        self.total_steps = cfg.training.steps
        self.memory = MemoryMonitor(device)
        self.goodput = goodput or GoodputTracker(None, rank)
        self.goodput.start_training(start_step)  # initialization ends here
        self._goodput_logged_at = -1
        self.sinks = []  # what this rank writes to: TensorBoard and JSONL on rank 0, W&B on rank 0 or every rank
        if cfg.metrics.enable_wandb:
            self.sinks.extend(self._wandb(cfg, rank, dump_folder, start_step))
        if rank == 0 and cfg.metrics.enable_tensorboard:
            # purge_step makes TensorBoard drop what an earlier run (or the pre-crash part of this one) logged at
            # steps >= the first step we are about to write, so resumed curves never zig-zag.
            self.sinks.append(TensorBoardSink(f"{dump_folder}/tb", purge_step=start_step + 1))
        if rank == 0 and cfg.metrics.enable_jsonl:
            self.sinks.append(JsonlSink(f"{dump_folder}/metrics.jsonl", purge_step=start_step + 1))
        self._reset_interval(start_step)

    @staticmethod
    def _wandb(cfg, rank: int, dump_folder: str, start_step: int) -> list[WandbSink]:
        every = cfg.metrics.wandb_every_rank
        ids = [WandbSink.run_id(dump_folder, start_step > 0) if rank == 0 else None]
        if every and dist.get_world_size() > 1:
            dist.broadcast_object_list(ids, src=0)  # every rank's run is grouped under the job's id
        if rank != 0 and not every:
            return []
        config = dataclasses.asdict(cfg)
        return [
            WandbSink(
                dump_folder, cfg.metrics.wandb_project, ids[0], start_step, config, rank if every else None
            )
        ]

    def _reset_interval(self, step: int) -> None:
        self.interval_start = time.perf_counter()
        self.interval_phases = self.goodput.phase_seconds  # validation and checkpoint time is not step time
        self.interval_first_step = step
        self.data_time = 0.0
        self.memory.reset_peak()

    def _emit(self, step: int, m: dict[str, float]) -> None:
        for sink in self.sinks:
            sink.write(step, m)

    def should_log(self, step: int) -> bool:
        return step == 1 or step % self.cfg.metrics.log_freq == 0 or step == self.total_steps

    def record_step(
        self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor, lr: float, data_time_s: float
    ) -> dict[str, float] | None:
        """Account one finished optimizer step; on log steps compute, emit and return the metrics."""
        self.data_time += data_time_s
        self.goodput.step_done(step, data_time_s)
        if not self.should_log(step):
            return None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        elapsed = now - self.interval_start - (self.goodput.phase_seconds - self.interval_phases)
        steps = step - self.interval_first_step
        step_time = elapsed / steps

        # One all-reduce for the sums, one for the maxima (both over the dp mesh, so each replica counts once
        # even when tp/pp/cp peers share its batch), one all-gather of every rank's step and data time.
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
        # this rank's TFLOPS, with the same operations as throughput_metrics below (so equal rates compare equal)
        local_tflops = self.flops_per_token * (local_rate / self.dims.non_data_parallel_size) / 1e12
        mine = torch.tensor([step_time, self.data_time / steps, local_tflops], dtype=torch.float64)
        per_rank = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(per_rank, mine)
        self.peak, warning = raise_measured_peak(self.peak, max(t[2].item() for t in per_rank), step)
        if warning:
            logger.warning(warning)

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
                "time/data_s": self.data_time / steps,
                "time/data_share_pct": 100.0 * self.data_time / elapsed,
                "progress/tokens_seen": float(step * self.tokens_per_step * self.dims.dp),
                "progress/eta_s": (self.total_steps - step) * step_time,
            }
        )
        m.update(self.memory.snapshot())
        m.update(straggler_metrics([t[0].item() for t in per_rank], [t[1].item() for t in per_rank]))
        warning = straggler_warning(m, self.cfg.metrics.straggler_factor, self.interval_first_step + 1, step)
        if warning:
            logger.warning(warning)
        m.update(goodput_metrics(self.goodput.snapshot()))
        self.goodput.save_progress()
        self._emit(step, m)
        self.last_line = format_line(step, m, CONSOLE_FIELDS)
        self._reset_interval(step)
        return m

    def record_validation(self, step: int, result) -> dict[str, float]:
        """Emit validation/loss and validation/perplexity for an `evaluate.ValidationResult`; log its line."""
        m = validation_metrics(result.loss_sum, result.tokens)
        self._emit(step, m)
        logger.info(
            f"validation {step:>6d}  loss {m['validation/loss']:8.4f}  ppl {m['validation/perplexity']:10.3f}"
            f"  ({result.batches} batches, {result.tokens:,} tokens, {result.seconds:.1f} s)"
        )
        self.log_goodput(step)
        return m

    def log_goodput(self, step: int) -> None:
        """The goodput line (console and log; after each validation and at the end)."""
        logger.info(goodput_line(step, goodput_metrics(self.goodput.snapshot())))
        self._goodput_logged_at = step

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

    def close(self, step: int, finished: bool = False) -> None:
        """End of the run (finished, or stopped at `step`): the final goodput line and progress record."""
        if self._goodput_logged_at != step:  # not just printed by the last step's validation
            self.log_goodput(step)
        self.goodput.save_progress(finished=finished)
        for sink in self.sinks:
            sink.close()
