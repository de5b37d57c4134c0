"""The training loop, readable top to bottom: build -> step* -> finish.

python train.py --job.config_file train_configs/debug_model.toml          # one process
torchrun --nproc_per_node 2 train.py --job.config_file ...                # many
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from torchtitan.checkpoint import (
    EXIT_PREEMPTED,
    CheckpointManager,
    NonFiniteError,
    PreemptionFlag,
    check_resume_target,
    fault_hook,
    nan_hook_step,
    space_warning,
)
from torchtitan.config import JobConfig, help_text, parse_args, to_toml, validate
from torchtitan.data import build_dataloader, build_tokenizer, check_vocab
from torchtitan.disk import check_output_paths
from torchtitan.errors import UserError
from torchtitan.evaluate import Evaluator
from torchtitan.host_sync import StepChecks, forbid_syncs, to_host
from torchtitan.log import init_logger, logger
from torchtitan.metrics import MetricsProcessor, cpu_bf16_warning, resolve_peak
from torchtitan.metrics.goodput import PROGRESS_FILE, GoodputTracker
from torchtitan.models import get_model_class, model_args_from_config
from torchtitan.optim import build_lr_scheduler, build_optimizer, clip_grad_norm_, init_optimizer_state
from torchtitan.parallel import (
    ParallelDims,
    init_distributed,
    local_coords,
    materialize,
    parallelize,
    pick_device,
    pipeline_forward_backward,
    pipeline_parallelize,
    plan_pipeline,
    reduce_partial_grads,
    set_collective_timeout,
)
from torchtitan.parallel.compile import maybe_compile_loss
from torchtitan.parallel.context import build_cp_context
from torchtitan.parallel.cpu_bf16 import matmul_dtype
from torchtitan.parallel.distributed import check_node_count, launch_world
from torchtitan.profiling import EXIT_OOM, Profiler, oom_message, write_oom_snapshot
from torchtitan.quantize.float8 import build_scale_precompute, float8_flops_per_token
from torchtitan.runtime_env import set_env_defaults
from torchtitan.simulate import Simulation
from torchtitan.simulate import enabled as simulating
from torchtitan.watchdog import (
    Watchdog,
    comm_failure_message,
    die,
    hook_slow_data,
    hook_stall,
    is_comm_failure,
    last_completed_step,
)


def cross_entropy_loss(logits: torch.Tensor, labels: torch.Tensor, global_tokens: int) -> torch.Tensor:
    """Sum of this micro-batch's token cross-entropies divided by the tokens of the WHOLE optimizer step.

    The step's loss is the mean over global_tokens = global batch x seq_len tokens (every dp rank, every
    micro-step). Dividing each micro-batch's sum by that one constant, and summing gradients over micro-steps and
    dp ranks (FSDP is set to sum, see parallel/fsdp.py), gives exactly the gradient of that mean: the same update
    as one large batch. Computed in fp32 whatever the compute dtype (bf16 log-softmax loses digits).
    """
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum") / global_tokens


def forward_backward(
    model_parts: list[torch.nn.Module],
    inputs: torch.Tensor,
    labels: torch.Tensor,
    global_tokens: int,
    loss_context=contextlib.nullcontext,
    pp=None,
    loss_fn=cross_entropy_loss,
) -> torch.Tensor:
    """One forward and backward pass over a micro-batch; returns its (detached, plain) share of the step loss.

    `loss_context` is loss_parallel() under tensor parallelism: the logits arrive sharded on the vocabulary and
    the cross-entropy and its backward must run inside it.
    `pp` is (schedule, has_first_stage, has_last_stage) under pipeline parallelism: the schedule cuts the batch
    into pipeline micro-batches and runs them through this rank's stages (its loss_fn is cross_entropy_loss with
    the same global_tokens); ranks without the last stage return a zero loss.
    """
    if pp is not None:
        schedule, has_first, has_last = pp
        return pipeline_forward_backward(schedule, inputs, labels, has_first, has_last, loss_context)
    (model,) = model_parts
    logits = model(inputs)
    with loss_context():
        loss = loss_fn(logits, labels, global_tokens)
        del logits  # the largest activation; free it before backward allocates gradients
        loss.backward()
    loss = loss.detach()
    return loss.full_tensor() if isinstance(loss, DTensor) else loss


def train(cfg: JobConfig) -> int:
    started = time.perf_counter()
    # ---- build -------------------------------------------------------------------------------------------------
    # comm.mode=fake_backend: this one process plays one rank of a larger job (simulate.py); else None
    sim = Simulation(cfg) if simulating(cfg) else None
    if sim is None:
        # A world that does not match the config fails here with both numbers, before any rank waits for another.
        check_node_count(cfg.job.expected_nodes)
        dims = ParallelDims.from_config(cfg.parallelism, launch_world()[0])
    else:
        dims = sim.dims()
    dump = cfg.job.dump_folder
    check_output_paths(cfg)  # every folder the run writes: creatable and writable, before any process group
    init_logger(sim.rank if sim else int(os.environ.get("RANK", 0)), os.path.join(dump, "logs"))
    device = pick_device()
    model_args = model_args_from_config(cfg.model, cfg.training.seq_len)
    # NCCL error handling and flight-recorder dumps, cuBLAS determinism, CPU malloc: before those libraries start
    env_defaults = set_env_defaults(cfg, device.type, model_args.largest_weight_bytes())
    dims.validate(model_args, cfg, device.type)  # every degree/shape/batch constraint, before allocating
    if dims.pp_enabled:  # and every pipeline constraint (stages, schedule, micro-batches)
        pp_plan = plan_pipeline(
            cfg.parallelism, model_args.n_layers, cfg.training.local_batch_size, model_args.tie_embeddings
        )
    rank, world_size = (
        sim.init_process_group() if sim else init_distributed(device, cfg.comm.init_timeout_seconds)
    )
    if rank == 0 and (low_space := space_warning(cfg, model_args.num_params())):
        logger.warning(low_space)
    # Where the wall clock goes, from this process's start; continued across restarts through the checkpoint
    progress = os.path.join(dump, PROGRESS_FILE) if cfg.checkpoint.enable else None
    goodput = GoodputTracker(progress, rank)
    preempt = PreemptionFlag()  # from here on SIGTERM/SIGUSR1 mean "save at the end of the step, exit 75"
    dims.build_mesh(device.type)
    dp_rank = dims.mesh("dp").get_local_rank()
    torch.manual_seed(cfg.training.seed)
    if cfg.training.deterministic:
        torch.use_deterministic_algorithms(True)

    if rank == 0 and cfg.job.print_config:
        logger.info("effective config (saved to %s/config.toml once the run starts):\n%s", dump, to_toml(cfg))

    if sim is None:  # the simulation trains on random tokens: no tokenizer, no dataset
        tokenizer = build_tokenizer(cfg.model.tokenizer_path)
        check_vocab(tokenizer, model_args.vocab_size, cfg.model.tokenizer_path)
        check_resume_target(cfg, tokenizer)  # the checkpoint to load fits this model: said before building it

    # Meta device -> parallelize -> materialize -> initialize: no rank ever holds the full unsharded model.
    # `model_parts` is the list of modules this rank runs: the whole model, or its pipeline stages.
    with torch.device("meta"):
        model = get_model_class(cfg.model.name)(model_args)
    # FLOPs/token done in float8 linears, counted on the whole model before any of it is converted or split
    fp8_flops_per_token = float8_flops_per_token(model, cfg.float8.min_dim) if cfg.float8.enable else 0
    loss_fn = maybe_compile_loss(cross_entropy_loss, cfg)
    pp = None
    if dims.pp_enabled:
        # the schedule computes each pipeline micro-batch's loss itself: the same normalization as below
        tr = cfg.training
        step_tokens = dims.grad_accumulation_steps(tr) * tr.local_batch_size * tr.seq_len * dims.dp
        schedule, model_parts, has_first, has_last = pipeline_parallelize(
            model,
            pp_plan,
            dims,
            cfg,
            device,
            functools.partial(loss_fn, global_tokens=step_tokens),
            make_stage=sim.make_stage(dims, model_args) if sim else None,  # fake messages carry no shapes
        )
        pp = (schedule, has_first, has_last)
        del model  # the stages are deep copies; the full meta model is no longer needed
    else:
        model_parts = [parallelize(model, dims, cfg)]
    for part in model_parts:  # allocate this rank's shards (uninitialized) and compute the RoPE table
        materialize(part, device, cpu_offload=cfg.parallelism.fsdp_cpu_offload)
        part.train()

    t = cfg.training
    optimizer = build_optimizer(model_parts, cfg)
    precompute_float8_scales = build_scale_precompute(cfg)
    scheduler = build_lr_scheduler(optimizer, cfg)
    if sim is None:
        dataloader = build_dataloader(
            dataset=cfg.data.dataset,
            dataset_path=cfg.data.dataset_path,
            text_field=cfg.data.text_field,
            tokenizer=tokenizer,
            dp_rank=dp_rank,
            dp_world_size=dims.dp,
            batch_size=t.local_batch_size,
            seq_len=t.seq_len,
            num_shards=cfg.data.num_shards,
        )
    else:  # random tokens of the run's shapes
        dataloader = sim.batches(model_args.vocab_size, t.local_batch_size, t.seq_len, dp_rank)

    accum_steps = dims.grad_accumulation_steps(t)
    local_tokens = t.local_batch_size * t.seq_len * accum_steps  # per dp rank and optimizer step
    global_tokens = local_tokens * dims.dp
    loss_context = (
        loss_parallel if dims.tp_enabled and cfg.parallelism.enable_loss_parallel else contextlib.nullcontext
    )
    cp_context = build_cp_context(
        dims, cfg.parallelism.context_parallel_rotate_method, model_parts, t.seq_len
    )
    validator = None
    if cfg.validation.enable:  # held-out loss on fixed batches (forward only, any layout): evaluate.py
        validator = Evaluator(
            cfg, dims, device, tokenizer, model_parts, loss_fn, loss_context, cp_context, pp, global_tokens
        )

    # ---- initialize or load (before the metrics, which continue the curves at the resumed step) ----------------
    ckpt = CheckpointManager(
        cfg,
        model_parts,
        optimizer,
        scheduler,
        dataloader,
        rank=rank,
        dp_rank=dp_rank,
        dp=dims.dp,
        extra_state={"goodput": goodput},
    )
    # A run that resumes, or starts from initial_load_path, draws no random weights: the load overwrites them all.
    load_from = None if cfg.checkpoint.create_seed_checkpoint else ckpt.path_to_load()
    init_start = time.perf_counter()
    if load_from is None:  # each rank computes only the elements it holds, on its device (docs/model.md)
        for part in model_parts:
            part.init_weights(t.seed, local_coords=local_coords)
    init_s = time.perf_counter() - init_start
    if rank == 0:  # only now: a run stopped by a check above leaves the previous run's config.toml as it was
        with open(os.path.join(dump, "config.toml"), "w") as f:
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

    flops_per_token = model_args.flops_per_token(t.seq_len, causal=cfg.metrics.causal_flops)
    compute_dtype = torch.bfloat16 if t.mixed_precision_param == "bfloat16" else torch.float32
    # MFU is measured against the matmul kernels the run uses (fp32 ones for bf16 on a CPU without bf16)
    kernel_dtype = matmul_dtype(device.type, compute_dtype, t.cpu_bf16_fp32_kernels)
    peak = resolve_peak(device, kernel_dtype, cfg.metrics.peak_tflops)
    metrics = MetricsProcessor(
        cfg=cfg,
        dims=dims,
        device=device,
        rank=rank,
        flops_per_token=flops_per_token,
        float8_flops_per_token=fp8_flops_per_token,
        peak=peak,
        tokens_per_step_per_dp_rank=local_tokens,
        dump_folder=dump,
        start_step=start_step,
        goodput=goodput,
    )
    header = [sim.header()] if sim else []
    header += [
        f"model {cfg.model.name} {cfg.model.flavor}: {model_args.num_params():,} parameters"
        f" ({model_args.num_flop_params():,} in matmuls), {world_size} x {device.type}",
        f"parallelism: {dims.describe()}",
        f"batch: {t.local_batch_size} x {t.seq_len} tokens per dp rank and micro-step, {dims.dp} dp ranks,"
        f" {accum_steps} micro-steps, {global_tokens:,} tokens per step, {t.steps} steps",
        f"flops/token: {flops_per_token:,.0f} ("
        + ("causal attention halved" if cfg.metrics.causal_flops else "full attention, 6N + 12*L*H*D*S")
        + ")",
        f"MFU peak: {metrics.peak.bf16_tflops:.2f} TFLOPS per device from {metrics.peak.source}",
        "startup: "
        + (f"weights loaded from {load_from}" if load_from else f"weights initialized in {init_s:.2f} s")
        + f", optimizer state allocated in {optim_s:.2f} s, {time.perf_counter() - started:.1f} s since start",
    ]
    if env_defaults:
        header.append("environment defaults: " + " ".join(f"{k}={v}" for k, v in env_defaults.items()))
    if fp8_flops_per_token:
        header.append(metrics.float8_header())
    for line in header:
        logger.info(line)
    metrics.write_text("run/header", "\n\n".join(header))
    if note := cpu_bf16_warning(device, compute_dtype, fp32_kernels=kernel_dtype != compute_dtype):
        logger.warning(note)

    # Python's cyclic GC can pause a rank for ~100 ms at random steps; collect at fixed steps instead, on all ranks.
    if t.gc_freq > 0:
        gc.disable()
        gc.collect(1)
    # Every process group (default, mesh sub-groups, checkpoint) waits up to the init timeout in the first step
    # (compile, warm-up, lazy init); the training timeout takes over once it has completed.
    set_collective_timeout(cfg.comm.init_timeout_seconds)
    checks = StepChecks(device, ignore_nonfinite=sim is not None)
    nan_step = nan_hook_step()
    watchdog = Watchdog(cfg.comm.watchdog_timeout_seconds, cfg.comm.init_timeout_seconds, rank)

    # ---- train -------------------------------------------------------------------------------------------------
    profiler = Profiler(cfg, rank, dump, start_step)
    data_iter = hook_slow_data(iter(dataloader), rank)
    for step in range(start_step + 1, t.steps + 1):
        if t.gc_freq > 0 and step % t.gc_freq == 0:
            gc.collect(1)
        # Check steps read device values on the host and agree across ranks; the others never wait for the device.
        check_step = t.skip_nonfinite_steps or metrics.should_log(step) or ckpt.should_save(step, t.steps)
        forbid_syncs(not check_step, device)  # test hook: on CUDA, a sync outside check steps raises
        hook_stall(step, rank)
        if sim:
            sim.step_start(device)
        optimizer.zero_grad(set_to_none=True)
        loss, data_time = torch.zeros((), device=device), 0.0
        for _ in range(accum_steps):  # gradients add up over micro-steps
            data_start = time.perf_counter()
            inputs, labels = next(data_iter)
            inputs, labels = inputs.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            data_time += time.perf_counter() - data_start
            with cp_context(inputs, labels):  # context parallel: shards them on the sequence; else no-op
                loss += forward_backward(
                    model_parts, inputs, labels, global_tokens, loss_context, pp, loss_fn
                )
        # `loss` is this rank's share of the global mean; report the rank's own mean token loss (under context
        # parallel, the rank's part of its dp rank's mean: the metrics add the cp ranks' parts)
        loss = loss * (global_tokens / local_tokens)
        # TP without FSDP: the norm gains' gradients are per-rank partial sums (FSDP2 would reduce them)
        reduce_partial_grads(model_parts)
        if step == nan_step:
            loss = loss * float("nan")
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
            checks.agree(preempt.signum, ckpt.failed()) if check_step else (0, 0, 0)
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
            if precompute_float8_scales is not None:
                precompute_float8_scales(model_parts)
        lr = scheduler.get_last_lr()[0]
        scheduler.step()
        if sim:
            sim.step_done(device)  # per-step time (compute only) and the step's peak memory

        tokens_seen += global_tokens

        if metrics.record_step(step, loss, grad_norm, lr, data_time) is not None:
            logger.info(metrics.last_line)
        profiler.step()
        fault_hook("step_end", step, rank, before=ckpt.wait)
        if ckpt.should_save(step, t.steps) or (signum and cfg.checkpoint.enable):
            last = step == t.steps and cfg.checkpoint.last_save_model_only
            with goodput.phase("checkpoint_save"):
                ckpt.save(step, tokens_seen, kind="export" if last else "full")
        ckpt.poll()
        if validator is not None and validator.due(step):
            with goodput.phase("validation"):
                metrics.record_validation(step, validator.run())
        if signum:
            watchdog.stop()
            profiler.stop()
            ckpt.close()
            metrics.close(step)
            if not cfg.checkpoint.enable:
                logger.warning(
                    f"signal {signum} received at step {step}; checkpoint.enable=false: nothing saved"
                )
                return 128 + signum
            logger.warning(
                f"signal {signum} received: checkpoint saved at step {step}; exiting {EXIT_PREEMPTED}"
            )
            return EXIT_PREEMPTED
        if step == start_step + 1:
            set_collective_timeout(cfg.comm.train_timeout_seconds)
            logger.info(
                f"first step done {time.perf_counter() - started:.1f} s after start; collective timeout now"
                f" {cfg.comm.train_timeout_seconds} s (comm.train_timeout_seconds)"
            )
        # Last in the step: anything slow at its end (a checkpoint save) counts as part of this step.
        watchdog.beat(step)

    # ---- finish ------------------------------------------------------------------------------------------------
    watchdog.stop()
    profiler.stop()
    ckpt.close()  # an async save still in flight is waited for and committed
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
            from torchtitan.preflight import run_checks

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
    sys.exit(main())
