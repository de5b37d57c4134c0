"""The training loop, readable top to bottom: build -> initialize or load -> steps -> finish.

python train.py --job.config_file train_configs/debug_model.toml          # one process
torchrun --nproc_per_node 2 train.py --job.config_file ...                # many

Every metric, check and save point is called from train() below; what they do lives in modules named for it:
the run's parts and their build order (build.py), the loss and a micro-batch's forward/backward (loss.py), the
numbers reported (metrics/processor.py, defined in docs/metrics.md), the run header (header.py), the
non-finite / preemption / failed-save agreement of check steps (host_sync.py), saves and loads (checkpoint/).
"""

from __future__ import annotations

import gc
import os
import sys
import time

import torch
import torch.distributed as dist

from torchtitan import gc_policy
from torchtitan.build import build_metrics, build_run, initialize_weights
from torchtitan.config import JobConfig, help_text, parse_args, to_toml, validate
from torchtitan.errors import UserError
from torchtitan.header import log_run_header
from torchtitan.host_sync import EXIT_PREEMPTED, NonFiniteError, StepChecks, to_host
from torchtitan.log import logger
from torchtitan.loss import forward_backward
from torchtitan.optim import clip_grad_norm_, init_optimizer_state
from torchtitan.parallel import reduce_partial_grads, set_collective_timeout
from torchtitan.parallel.distributed import exit_process, launch_world
from torchtitan.preflight import run_checks
from torchtitan.profiling import EXIT_OOM, Profiler, oom_message, write_oom_snapshot
from torchtitan.simulate import Simulation
from torchtitan.simulate import enabled as simulating
from torchtitan.testing import faults
from torchtitan.watchdog import (
    Watchdog,
    comm_failure_message,
    die,
    is_comm_failure,
    last_completed_step,
)


def train(cfg: JobConfig) -> int:
    started = time.perf_counter()
    # ---- build: checks, world, mesh, model (meta -> parallelize -> materialize), optimizer, data, checkpointer --
    run = build_run(cfg)
    t, dims, device, rank, sim, goodput = cfg.training, run.dims, run.device, run.rank, run.sim, run.goodput
    model_parts, optimizer, ckpt, dataloader = run.model_parts, run.optimizer, run.ckpt, run.dataloader

    # ---- initialize or load (before the metrics, which continue the curves at the resumed step) ----------------
    # A run that resumes, or starts from initial_load_path, draws no random weights: the load overwrites them all.
    load_from = None if cfg.checkpoint.create_seed_checkpoint else ckpt.path_to_load()
    init_s = initialize_weights(model_parts, t.seed) if load_from is None else 0.0  # seconds it took
    if rank == 0:  # only now: a run stopped by a check above leaves the previous run's config.toml as it was
        with open(os.path.join(cfg.job.dump_folder, "config.toml"), "w") as f:
            f.write(to_toml(cfg))
    if cfg.checkpoint.create_seed_checkpoint:
        ckpt.save(0, 0, kind="seed")
        logger.info("seed checkpoint written; exiting (checkpoint.create_seed_checkpoint)")
        return 0
    optim_start = time.perf_counter()
    init_optimizer_state(optimizer)  # here, not hidden inside the first step
    optim_s = time.perf_counter() - optim_start
    with goodput.phase("checkpoint_load"):
        start_step, tokens_seen = ckpt.load()
    if load_from is not None and ckpt.loaded_path is None:
        raise RuntimeError(f"checkpoint {load_from} was picked but not loaded: the weights are uninitialized")

    # Every number reported is defined in docs/metrics.md and computed in metrics/processor.py; MFU's peak is
    # resolved (table, metrics.peak_tflops or a short calibration) here, then the header says what the run is.
    metrics, peak = build_metrics(run, start_step)
    log_run_header(run, metrics, load_from, init_s, optim_s, started)
    # Python's cyclic GC can pause a rank for ~100 ms at random steps; collect at fixed steps instead, on all ranks.
    # It was paused through start-up (train.py; torchtitan/gc_policy.py); with gc_freq 0 it is automatic again.
    gc_policy.resume(automatic=t.gc_freq == 0)
    # Every process group (default, mesh sub-groups, checkpoint) waits up to the init timeout in the first step
    # (compile, warm-up, lazy init); the training timeout takes over once it has completed.
    set_collective_timeout(cfg.comm.init_timeout_seconds)
    checks = StepChecks(device, ignore_nonfinite=sim is not None)
    watchdog = Watchdog(cfg.comm.watchdog_timeout_seconds, cfg.comm.init_timeout_seconds, rank)

    # ---- train -------------------------------------------------------------------------------------------------
    profiler = Profiler(cfg, rank, cfg.job.dump_folder, start_step)
    if sim:  # on CPU the simulated rank counts its first step's tensors (no allocator counters there)
        sim.track_tensors(model_parts, optimizer, device)
    data_iter = faults.slow_data(iter(dataloader), rank)
    signum = 0  # a preemption signal all ranks agreed on: save (if checkpoints are on) and leave
    for step in range(start_step + 1, t.steps + 1):
        if t.gc_freq > 0 and step % t.gc_freq == 0:
            gc.collect(1)
        # Check steps read device values on the host and agree across ranks; the others never wait for the device.
        check_step = t.skip_nonfinite_steps or metrics.should_log(step) or ckpt.should_save(step, t.steps)
        faults.forbid_syncs(not check_step, device)  # test hook: on CUDA, a sync outside check steps raises
        faults.hook_stall(step, rank)
        if sim:
            sim.step_start(device)
        optimizer.zero_grad(set_to_none=True)
        loss, data_time = torch.zeros((), device=device), 0.0
        for _ in range(run.accum_steps):  # gradients add up over micro-steps
            data_start = time.perf_counter()
            inputs, labels = next(data_iter)
            # the loader's own time: the copy below is step time
            data_time += time.perf_counter() - data_start
            # from pageable memory the driver may sync the stream before the copy (the host waits for the queued step)
            inputs, labels = inputs.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            with run.cp_context(inputs, labels):  # context parallel: shards them on the sequence; else no-op
                loss += forward_backward(
                    model_parts, inputs, labels, run.global_tokens, run.loss_context, run.pp, run.loss_fn
                )
        # `loss` is this rank's share of the global mean; report the rank's own mean token loss (under context
        # parallel, the rank's part of its dp rank's mean: the metrics add the cp ranks' parts)
        loss = loss * (run.global_tokens / run.local_tokens)
        # TP without FSDP: the norm gains' gradients are per-rank partial sums (FSDP2 would reduce them)
        reduce_partial_grads(model_parts)
        loss = faults.nan_loss(step, loss)  # test hook: a NaN loss in a chosen step
        grad_norm = clip_grad_norm_(
            [p for part in model_parts for p in part.parameters()],
            t.max_norm,
            pp_mesh=dims.mesh("pp") if dims.pp_enabled else None,
        )
        # Non-finite values are remembered on the device every step and read on check steps, where all ranks also
        # agree on a preemption signal and on a failed background checkpoint save (one tiny all-reduce), so they
        # skip/stop/save at the same step. Save steps are check steps and the check comes before optimizer.step:
        # a NaN never reaches a checkpoint.
        checks.record(step, loss, grad_norm)
        bad_step, signum, save_failed = (
            checks.agree(run.preempt.signum, ckpt.failed()) if check_step else (0, 0, 0)
        )
        if save_failed:
            ckpt.report_failure()  # every rank: one line (what failed, free space, last good checkpoint), exit 2
        if bad_step:
            loss_now, norm_now = to_host(loss, grad_norm)
            now = f"loss {loss_now:.4g}, grad norm {norm_now:.4g} on rank {rank}"
            if not t.skip_nonfinite_steps:
                found = f", found at check step {step}" if bad_step != step else ""
                raise NonFiniteError(
                    f"non-finite loss or grad norm at step {bad_step} ({now}{found}); stopped without saving, the"
                    " last checkpoint is untouched (training.skip_nonfinite_steps=true skips such steps)"
                )
            logger.warning(f"step {step}: non-finite loss or grad norm ({now}); step skipped, grads zeroed")
            optimizer.zero_grad(set_to_none=True)
        else:
            optimizer.step()
            if run.precompute_float8_scales is not None:
                run.precompute_float8_scales(model_parts)
        lr = run.scheduler.get_last_lr()[0]
        run.scheduler.step()
        if sim:
            sim.step_done(device)  # per-step time (compute only) and the step's peak memory
        tokens_seen += run.global_tokens

        if metrics.record_step(step, loss, grad_norm, lr, data_time) is not None:
            logger.info(metrics.last_line)
        profiler.step()
        faults.kill_at("step_end", step, rank, before=ckpt.wait)
        if ckpt.should_save(step, t.steps) or (signum and cfg.checkpoint.enable):
            last = step == t.steps and cfg.checkpoint.last_save_model_only
            with goodput.phase("checkpoint_save"):
                ckpt.save(step, tokens_seen, kind="export" if last else "full")
        ckpt.poll()
        if run.validator is not None and run.validator.due(step):
            with goodput.phase("validation"):
                metrics.record_validation(step, run.validator.run())
        if signum:
            break  # saved just above (with checkpoints on); every rank leaves at this step
        if step == start_step + 1:
            set_collective_timeout(cfg.comm.train_timeout_seconds)
            logger.info(
                f"first step done {time.perf_counter() - started:.1f} s after start"
                f" ({time.time() - goodput.attempt_start_unix:.1f} s after the process started); collective"
                f" timeout now {cfg.comm.train_timeout_seconds} s (comm.train_timeout_seconds)"
            )
        # Last in the step: anything slow at its end (a checkpoint save) counts as part of this step.
        watchdog.beat(step)

    # ---- finish ------------------------------------------------------------------------------------------------
    watchdog.stop()
    profiler.stop()
    ckpt.close()  # an async save still in flight is waited for and committed
    if signum:
        metrics.close(step)
        if not cfg.checkpoint.enable:
            logger.warning(f"signal {signum} received at step {step}; checkpoint.enable=false: nothing saved")
            return 128 + signum
        logger.warning(f"signal {signum} received: checkpoint saved at step {step}; exiting {EXIT_PREEMPTED}")
        return EXIT_PREEMPTED
    metrics.close(t.steps, finished=True)
    logger.info("training finished after %d steps", t.steps)
    if sim:  # this rank's memory and step time beside the estimator's: <dump_folder>/simulation.json
        sim.finish(model_parts, optimizer, dims, device, peak.bf16_tflops)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--help" in argv or "-h" in argv:
        print(help_text())
        return 0
    try:
        cfg = parse_args(argv)
        validate(cfg)
        if cfg.job.dry_run:  # the launch checks only: no process group, no device, no training
            world, nodes = launch_world()
            if simulating(cfg):  # check the simulated world (and the simulation's own keys)
                world, nodes = Simulation(cfg).world_size, None
            return run_checks(cfg, world, nodes if "WORLD_SIZE" in os.environ else None)
        rc = train(cfg)
        # Every rank returns from train() at the same step (finished, seed written, or preempted). Leave together:
        # a rank that tears down its gloo pairs while a peer is still talking to it makes the peer abort.
        dist.barrier()
        return rc
    except UserError as e:
        # one write of the whole line: ranks share torchrun's stderr, and print's two writes (text, then the
        # newline) interleaved two ranks' lines into one under PYTHONUNBUFFERED=1 on a loaded machine
        sys.stderr.write(f"error: {e}\n")
        return e.exit_code
    except torch.cuda.OutOfMemoryError as e:  # one line with the snapshot's path, exit EXIT_OOM
        rank, step = int(os.environ.get("RANK", 0)), (last_completed_step() or 0) + 1
        folder = os.path.join(cfg.job.dump_folder, cfg.profiling.memory_snapshot_folder)
        die(oom_message(e, rank, step, write_oom_snapshot(folder, rank, step)), code=EXIT_OOM)
    except RuntimeError as e:
        if is_comm_failure(e):  # a peer died or hung: one line naming this rank and the step, exit 3
            die(comm_failure_message(e), exc=e)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    exit_process(main())  # as train.py: without the interpreter's final teardown
