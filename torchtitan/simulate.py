"""One rank of a large job on one device: `--comm.mode=fake_backend` (docs/launching.md, "Check a cluster config
on one machine").

    python train.py --job.config_file train_configs/llama3_70b.toml --comm.mode=fake_backend \\
        --comm.fake_world_size=256 --comm.fake_rank=200

This process becomes rank `fake_rank` of `fake_world_size` over torch's fake process group
(torch.testing._internal.distributed.fake_pg): every collective and point-to-point message returns at once and
moves no data. Everything else is the real run: the same ParallelDims and mesh, the same parallelize /
pipeline plan, this rank's shards materialized and initialized, AdamW state allocated, and the configured steps
computed on this rank's shapes. So memory and compute are this rank's; values are not (FSDP's all-gathers leave
their buffers as allocated), hence: no non-finite stop, no checkpoint saving, random-token batches (the tokenizer
and dataset are the preflight's concern, not the layout's).

What it reports: the header line, the time of each step (compute only: nothing waits for a peer), this rank's
parameter / gradient / optimizer-state bytes counted from its tensors after the last optimizer step, the peak
(CPU: the process's peak resident set; CUDA: max allocated and reserved), the peak of the tensors alive at once
(CUDA: max allocated; CPU, which keeps no allocator counters: the first step counted by torch's MemTracker, unless
the modules are compiled), and `<dump_folder>/simulation.json` beside the estimator's answer for the same config
and rank (torchtitan/estimate).
"""

from __future__ import annotations

import copy
import json
import os
import time

import torch
import torch.distributed as dist

from torchtitan.errors import UserError
from torchtitan.log import logger
from torchtitan.metrics.memory import MemoryMonitor, _max_rss_bytes
from torchtitan.parallel.dims import ParallelDims

GIB = 2**30


def enabled(cfg) -> bool:
    """Whether this run simulates one rank (comm.mode=fake_backend): the one place the mode is tested."""
    return cfg.comm.mode == "fake_backend"


class Simulation:
    """The fake-backend run's checks, process group, batches, stage shapes and report."""

    def __init__(self, cfg):
        c = cfg.comm
        if c.fake_world_size < 1:
            raise UserError(
                f"comm.fake_world_size = {c.fake_world_size}: comm.mode=fake_backend needs the world size to"
                " simulate, >= 1 (e.g. --comm.fake_world_size=64)"
            )
        if not 0 <= c.fake_rank < c.fake_world_size:
            raise UserError(
                f"comm.fake_rank = {c.fake_rank} is not a rank of comm.fake_world_size = {c.fake_world_size};"
                f" use 0 .. {c.fake_world_size - 1}"
            )
        launched = int(os.environ.get("WORLD_SIZE", 1))
        if launched > 1:
            raise UserError(
                f"comm.mode=fake_backend simulates a whole job in one process, but a launcher started"
                f" WORLD_SIZE={launched} processes; run `python train.py ...` without torchrun"
            )
        if cfg.checkpoint.enable or cfg.checkpoint.create_seed_checkpoint:
            key = "enable" if cfg.checkpoint.enable else "create_seed_checkpoint"
            raise UserError(
                f"checkpoint.{key}=true: comm.mode=fake_backend does not save checkpoints (no rank ever received"
                f" another's data, so the weights are meaningless); set checkpoint.{key}=false"
            )
        if cfg.checkpoint.initial_load_path:
            raise UserError(
                "checkpoint.initial_load_path is set: comm.mode=fake_backend cannot load a checkpoint (loading"
                " plans are agreed by collectives that move nothing here); unset it"
            )
        if cfg.validation.enable:
            raise UserError(
                "validation.enable=true: comm.mode=fake_backend runs training steps only (its losses are"
                " meaningless); set validation.enable=false"
            )
        self.cfg = cfg
        self.rank, self.world_size = c.fake_rank, c.fake_world_size
        os.environ.setdefault("LOG_RANK", str(self.rank))  # the one process logs to the console
        self.step_times: list[float] = []
        self.peaks = (0, 0)  # over the steps: CUDA max allocated and reserved; CPU peak resident set (twice)
        self._mark = 0.0
        self._tracker = None  # CPU: the MemTracker counting the first step
        self.tensor_peak: int | None = None  # CPU: bytes of the tensors alive at once in the first step

    # ---- build ---------------------------------------------------------------------------------------------

    def dims(self) -> ParallelDims:
        """The layout for the simulated world; a mismatch names comm.fake_world_size."""
        try:
            return ParallelDims.from_config(self.cfg.parallelism, self.world_size)
        except UserError as e:
            raise UserError(f"comm.fake_world_size = {self.world_size}: {e}") from None

    def init_process_group(self) -> tuple[int, int]:
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=self.rank, world_size=self.world_size)
        return self.rank, self.world_size

    def batches(self, vocab_size: int, batch: int, seq_len: int, dp_rank: int):
        """Random token windows of the run's shape (inputs, labels), one per micro-step, forever."""
        g = torch.Generator().manual_seed(self.cfg.training.seed * 100_003 + dp_rank)
        while True:
            window = torch.randint(vocab_size, (batch, seq_len + 1), generator=g)
            yield window[:, :-1], window[:, 1:]

    def make_stage(self, dims: ParallelDims, model_args):
        """A PipelineStage factory for build_pipeline: explicit input/output shapes (a fake message carries no
        shapes to infer from), and the static-shape vote every stage would cast in a real run."""
        from torch.distributed import pipelining

        cfg = self.cfg
        p, t = cfg.parallelism, cfg.training
        mbs = p.pipeline_parallel_microbatch_size
        seq = t.seq_len // dims.cp
        # sequence parallel: the residual stream between blocks is sharded on the sequence (parallel/tensor.py)
        seq_stream = seq // dims.tp if dims.tp_enabled and p.enable_sequence_parallel else seq
        # FSDP's mixed precision runs every block in the param dtype; without FSDP the embedding's fp32 output
        # plus autocast's bf16 branch outputs keep the residual stream in fp32 (parallel/mixed_precision.py)
        low = torch.bfloat16 if t.mixed_precision_param == "bfloat16" else torch.float32
        stream_dtype = low if (dims.fsdp_enabled or p.fsdp_cpu_offload) else torch.float32
        vocab = (
            model_args.vocab_size // dims.tp
            if dims.tp_enabled and p.enable_loss_parallel
            else model_args.vocab_size
        )

        class StaticStage(pipelining.PipelineStage):
            # torch's warm-up vote sends each stage's "my shapes are static" flag along the pipeline; a fake
            # receive leaves the zero it was given, which would force shape inference by messages. Every stage
            # here has its shapes, so the vote a real run would reach is "static".
            def _warmup_forward_vote(self, has_backward, received_acc=None):
                return torch.ones(1, dtype=torch.int32, device=self.device)

            def _warmup_backward_result(self, received_result=None):
                return torch.ones(1, dtype=torch.int32, device=self.device)

        def make(part, stage, num_stages, device, group):
            meta = torch.device("meta")
            # hidden states carry gradients both ways (requires_grad: the stage allocates their grad buffers)
            hidden = torch.empty(
                mbs, seq_stream, model_args.dim, dtype=stream_dtype, device=meta
            ).requires_grad_()
            if stage == 0:
                inputs = torch.empty(mbs, seq, dtype=torch.int64, device=meta)
            else:
                inputs = hidden
            if stage == num_stages - 1:
                outputs = torch.empty(mbs, seq, vocab, dtype=low, device=meta).requires_grad_()
            else:
                outputs = hidden
            return StaticStage(
                part, stage, num_stages, device, input_args=inputs, output_args=outputs, group=group
            )

        return make

    def header(self) -> str:
        return (
            f"simulated rank {self.rank} of {self.world_size} (fake process groups: no communication, loss values"
            " meaningless)"
        )

    # ---- steps ---------------------------------------------------------------------------------------------

    def track_tensors(self, model_parts, optimizer, device: torch.device) -> None:
        """On CPU, count the first step's tensors with torch's MemTracker (torch.distributed._tools.mem_tracker:
        every storage an op creates, plus the modules' parameters, gradients and the optimizer's states): the peak
        CUDA's allocator counters give. The first step, which step_time_s leaves out when there are more, since the
        tracker's per-op work slows the step it counts. Every eager step is counted, whatever its passes and
        schedule (_step_tracker); compiled modules are not (their activations stay unmeasured)."""
        if device.type == "cpu" and not self.cfg.compile.enable:
            self._tracker = _step_tracker()
            self._tracker.track_external(*model_parts, optimizer)

    def step_start(self, device: torch.device) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if not self.step_times:  # the peaks cover the steps (init's transient buffers are not the step's)
            MemoryMonitor(device).reset_peak()
            if self._tracker is not None:
                self._tracker.__enter__()
        self._mark = time.perf_counter()

    def step_done(self, device: torch.device) -> None:
        # read before the metrics reset their peak counters on log steps
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            now = (torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device))
        else:
            rss = _max_rss_bytes()
            now = (rss, rss)
        self.peaks = (max(self.peaks[0], now[0]), max(self.peaks[1], now[1]))
        self.step_times.append(time.perf_counter() - self._mark)
        if self._tracker is not None:
            self._tracker.__exit__(None, None, None)
            peak = self._tracker.get_tracker_snapshot("peak")
            self.tensor_peak = sum(d["Total"] for d in peak.values())
            self._tracker = None
        logger.info(f"simulated step {len(self.step_times)}: {self.step_times[-1]:.3f} s (compute only)")

    # ---- report --------------------------------------------------------------------------------------------

    def measured_gib(self, model_parts, optimizer, device: torch.device) -> dict[str, float | None]:
        """This rank's state counted from its tensors (after the last optimizer step: parameters, gradients and
        both AdamW moments all exist then) and the run's peak."""
        params = [p for part in model_parts for p in part.parameters()]
        out = {
            "parameters": _bytes(params) / GIB,
            "gradients": _bytes([p.grad for p in params if p.grad is not None]) / GIB,
            "optimizer_states": _bytes(
                [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
            )
            / GIB,
            # the tensor peak minus the states above; None where no tensor peak was counted
            "activations": None,
        }
        allocated, reserved = self.peaks
        if device.type != "cuda":
            allocated = self.tensor_peak
        if allocated is not None:
            out["activations"] = (
                allocated / GIB - out["parameters"] - out["gradients"] - out["optimizer_states"]
            )
            out["max_allocated"] = allocated / GIB
        out["peak"] = reserved / GIB
        return out

    def finish(
        self, model_parts, optimizer, dims: ParallelDims, device: torch.device, peak_tflops: float
    ) -> dict:
        measured = self.measured_gib(model_parts, optimizer, device)
        pp_rank = dims.mesh("pp").get_local_rank() if dims.pp_enabled else 0
        estimated, parts = estimate_rank(self.cfg, self.world_size, pp_rank, device, peak_tflops)
        compute_s = parts["no_communication"]
        step_time = min(self.step_times[1:] or self.step_times)  # after the first step's warm-up, if any
        result = {
            "world_size": self.world_size,
            "rank": self.rank,
            "device": device.type,
            "measured_gib": measured,
            "estimated_gib": estimated,
            "step_time_s": step_time,
            "estimated_compute_s": compute_s,
            "step_times_s": list(self.step_times),  # every step, first included (sync to sync)
            "estimated_step_s": parts,
        }
        path = os.path.join(self.cfg.job.dump_folder, "simulation.json")
        with open(path, "w") as f:
            json.dump(result, f, indent=2)

        def show(d):
            return ", ".join(f"{k} {'n/a' if v is None else f'{v:.3f}'}" for k, v in d.items())

        logger.info(f"simulated rank {self.rank} of {self.world_size}: step {step_time:.3f} s (compute only)")
        logger.info(f"measured GiB: {show(measured)}")
        logger.info(f"estimated GiB: {show(estimated)}; estimated compute {compute_s:.3f} s; written: {path}")
        return result


def _bytes(tensors) -> int:
    """Bytes of the values these tensors hold on this rank (a DTensor's local shard)."""
    from torch.distributed.tensor import DTensor

    total = 0
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        total += local.numel() * local.element_size()
    return total


def estimate_rank(cfg, world_size: int, pp_rank: int, device: torch.device, peak_tflops: float):
    """The estimator's memory breakdown (GiB, plus "peak") for this pipeline rank and its step seconds on this
    device, as `steptime.rank_step_parts` splits them (compute, optimizer, their sum `no_communication`: the parts
    a fake-backend step contains; `full`: the N-rank job's step). On CPU the rates are this run's measured matmul
    peak and a short copy-bandwidth measurement."""
    from torchtitan.estimate.calibrate import measure_bandwidth
    from torchtitan.estimate.memory import KEYS, rank_memory
    from torchtitan.estimate.plan import Calibration, build_plan
    from torchtitan.estimate.steptime import rank_step_parts, training_step_time
    from torchtitan.metrics.hardware import match_device

    c = copy.deepcopy(cfg)
    c.estimate.num_devices = world_size
    calibration = None
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        c.estimate.hardware = match_device(name) or "h100-sxm"
        if match_device(name) is None:  # never silently: the estimate below then prices an H100 SXM
            logger.warning(
                f"{name} is not in the hardware table: estimated_gib and compute priced as an H100 SXM"
            )
        c.estimate.memory_gib = torch.cuda.get_device_properties(device).total_memory / GIB
    else:
        c.estimate.hardware = "cpu"
        dtype = torch.bfloat16 if cfg.training.mixed_precision_param == "bfloat16" else torch.float32
        calibration = Calibration(
            device="cpu", matmul_peak_tflops=peak_tflops, hbm_gbps=measure_bandwidth(device, dtype, 0.2)
        )
    plan = build_plan(c, calibration, require_rates=False)
    parts = rank_memory(plan, pp_rank)
    estimated = {k: parts[k] / GIB for k in KEYS}
    estimated["peak"] = sum(parts.values()) / GIB
    return estimated, rank_step_parts(training_step_time(plan))


def _step_tracker():
    """torch's MemTracker without its per-module hooks. Its global peak, which every allocation, resize and free
    updates, is the one read here; the per-module statistics the hooks keep are not, and the hooks break steps
    this simulation runs: a root module's second forward in one tracked region ("multiple iterative calls":
    micro-steps, pipeline micro-batches) and the zero-bubble schedules' split backward, whose autograd.grad on a
    stage's leaf inputs fails under them ("A leaf node was passed to _will_engine_execute_node"). On every layout
    of tests/test_simulate.py that the hooked tracker could count, both peaks are equal to the byte (torch 2.13,
    session 53). It replaces the tracker's private `_mod_tracker` (a ModTracker) with the few members MemTracker
    asks of it; tests/test_simulate.py fails if a release changes them."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class NoModuleHooks:
        is_bw = False  # every op's storage is labelled a forward activation: the total is what is read
        parents: frozenset = frozenset()

        def register_user_hooks(self, *hooks) -> None:
            pass

        def clear_user_hooks(self) -> None:
            pass

        def __enter__(self):
            return self

        def __exit__(self, *args) -> None:
            pass

    tracker = MemTracker()
    tracker._mod_tracker = NoModuleHooks()
    return tracker
