"""The run's parts, built in the order the loop needs them: `build_run(cfg)` -> `Run`; the initial weights
(`initialize_weights`, when nothing is loaded) and the metrics (`build_metrics`, once the resumed step is known).

Order matters and is kept here in one place: every check that can fail on the config (paths, mesh, pipeline
plan, tokenizer, resume target) runs before the process group and before any allocation; the model is built on
the meta device, parallelized, then materialized, so no rank ever holds the full unsharded model; the metrics
come after the checkpoint load (train.py), since they continue the curves at the resumed step.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor.parallel import loss_parallel

from torchtitan.checkpoint import CheckpointManager, check_resume_target, space_warning
from torchtitan.config import JobConfig, to_toml
from torchtitan.data import build_dataloader, build_tokenizer, check_vocab
from torchtitan.disk import check_output_paths
from torchtitan.evaluate import Evaluator
from torchtitan.host_sync import PreemptionFlag
from torchtitan.log import init_logger, logger
from torchtitan.loss import cross_entropy_loss
from torchtitan.metrics import MetricsProcessor, resolve_peak
from torchtitan.metrics.goodput import PROGRESS_FILE, GoodputTracker
from torchtitan.metrics.hardware import PeakFlops
from torchtitan.models import get_model_class, model_args_from_config
from torchtitan.optim import build_lr_scheduler, build_optimizer
from torchtitan.parallel import (
    ParallelDims,
    init_distributed,
    local_coords,
    materialize,
    parallelize,
    pick_device,
    pipeline_parallelize,
    plan_pipeline,
)
from torchtitan.parallel.compile import maybe_compile_loss
from torchtitan.parallel.context import build_cp_context
from torchtitan.parallel.cpu_bf16 import matmul_dtype
from torchtitan.parallel.distributed import check_node_count, launch_world
from torchtitan.quantize.float8 import build_scale_precompute, float8_flops_per_token
from torchtitan.runtime_env import set_env_defaults
from torchtitan.simulate import Simulation
from torchtitan.simulate import enabled as simulating


@dataclass
class Run:
    """Everything the loop uses that does not change from step to step."""

    cfg: JobConfig
    sim: Simulation | None  # comm.mode=fake_backend: this one process plays one rank of a larger job
    dims: ParallelDims
    device: torch.device
    model_args: Any  # the ModelArgs of model.name and model.flavor (shapes, parameter and FLOPs counts)
    env_defaults: dict[str, str]  # environment variables set for this run (logged in the header)
    rank: int
    world_size: int
    dp_rank: int
    goodput: GoodputTracker
    preempt: PreemptionFlag
    model_parts: list[torch.nn.Module]  # the modules this rank runs: the whole model, or its pipeline stages
    pp: tuple | None  # (schedule, has_first_stage, has_last_stage) under pipeline parallelism
    loss_fn: Callable
    optimizer: torch.optim.Optimizer
    scheduler: Any
    precompute_float8_scales: Callable | None
    dataloader: Any
    accum_steps: int  # micro-steps per optimizer step
    local_tokens: int  # tokens per dp rank and optimizer step
    global_tokens: int  # tokens per optimizer step, all dp ranks
    loss_context: Callable  # loss_parallel under tensor parallelism, else a no-op
    cp_context: Callable  # (inputs, labels) -> context that shards them over context parallel, else a no-op
    validator: Evaluator | None
    ckpt: CheckpointManager  # what is saved, when and where; resume (checkpoint/manager.py)
    flops_per_token: float
    fp8_flops_per_token: float  # the part done in float8 linears
    compute_dtype: torch.dtype
    kernel_dtype: torch.dtype  # what the matmuls compute in (fp32 for bf16 on a CPU without bf16)


def build_run(cfg: JobConfig) -> Run:
    """World, mesh, model, optimizer, data, evaluator and checkpointer of this run, on this rank."""
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
            cfg.parallelism,
            model_args.n_layers,
            cfg.training.local_batch_size,
            model_args.tie_embeddings,
            cfg.activation_checkpoint,
        )
    rank, world_size = (
        sim.init_process_group() if sim else init_distributed(device, cfg.comm.init_timeout_seconds)
    )
    if rank == 0 and (low_space := space_warning(cfg, model_args.num_params())):
        logger.warning(low_space)
    # on rank 0, and on a simulated rank (whichever rank it plays)
    zb_ac = dims.pp_enabled and pp_plan.split_backward and cfg.activation_checkpoint.mode != "none"
    if zb_ac and (rank == 0 or sim is not None):
        logger.warning(
            f"{pp_plan.schedule} under activation checkpointing: torch's weight pass recomputes every checkpointed"
            " block once per parameter group (10 recomputes a backward for a Llama block, holding about 5 x its"
            " activations; docs/pipeline.md), which python -m torchtitan.estimate prices;"
            " activation_checkpoint.mode='none' or Interleaved1F1B avoid it"
        )
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

    tokenizer = None
    if sim is None:  # the simulation trains on random tokens: no tokenizer, no dataset
        tokenizer = build_tokenizer(cfg.model.tokenizer_path)
        check_vocab(tokenizer, model_args.vocab_size, cfg.model.tokenizer_path)
        check_resume_target(cfg, tokenizer)  # the checkpoint to load fits this model: said before building it

    # Meta device -> parallelize -> materialize -> initialize: no rank ever holds the full unsharded model.
    with torch.device("meta"):
        model = get_model_class(cfg.model.name)(model_args)
    # FLOPs/token done in float8 linears, counted on the whole model before any of it is converted or split
    fp8_flops_per_token = float8_flops_per_token(model, cfg.float8.min_dim) if cfg.float8.enable else 0
    loss_fn = maybe_compile_loss(cross_entropy_loss, cfg, device.type)
    t = cfg.training
    accum_steps = dims.grad_accumulation_steps(t)
    local_tokens = t.local_batch_size * t.seq_len * accum_steps  # per dp rank and optimizer step
    global_tokens = local_tokens * dims.dp
    pp = None
    if dims.pp_enabled:
        # the schedule computes each pipeline micro-batch's loss itself: the same normalization as the loop's
        schedule, model_parts, has_first, has_last = pipeline_parallelize(
            model,
            pp_plan,
            dims,
            cfg,
            device,
            functools.partial(loss_fn, global_tokens=global_tokens),
            make_stage=sim.make_stage(dims, model_args) if sim else None,  # fake messages carry no shapes
        )
        pp = (schedule, has_first, has_last)
        del model  # the stages are deep copies; the full meta model is no longer needed
    else:
        model_parts = [parallelize(model, dims, cfg)]
    for part in model_parts:  # allocate this rank's shards (uninitialized) and compute the RoPE table
        materialize(part, device, cpu_offload=cfg.parallelism.fsdp_cpu_offload)
        part.train()

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
    compute_dtype = torch.bfloat16 if t.mixed_precision_param == "bfloat16" else torch.float32
    return Run(
        cfg=cfg,
        sim=sim,
        dims=dims,
        device=device,
        model_args=model_args,
        env_defaults=env_defaults,
        rank=rank,
        world_size=world_size,
        dp_rank=dp_rank,
        goodput=goodput,
        preempt=preempt,
        model_parts=model_parts,
        pp=pp,
        loss_fn=loss_fn,
        optimizer=optimizer,
        scheduler=scheduler,
        precompute_float8_scales=precompute_float8_scales,
        dataloader=dataloader,
        accum_steps=accum_steps,
        local_tokens=local_tokens,
        global_tokens=global_tokens,
        loss_context=loss_context,
        cp_context=cp_context,
        validator=validator,
        ckpt=ckpt,
        flops_per_token=model_args.flops_per_token(t.seq_len, causal=cfg.metrics.causal_flops),
        fp8_flops_per_token=fp8_flops_per_token,
        compute_dtype=compute_dtype,
        # MFU is measured against the matmul kernels the run uses (fp32 ones for bf16 on a CPU without bf16)
        kernel_dtype=matmul_dtype(device.type, compute_dtype, t.cpu_bf16_fp32_kernels),
    )


def initialize_weights(model_parts: list[torch.nn.Module], seed: int) -> float:
    """Draw the initial weights; returns the seconds it took. Each rank computes only the elements it holds, on
    its device, and they are the same whatever the layout (docs/model.md)."""
    start = time.perf_counter()
    for part in model_parts:
        part.init_weights(seed, local_coords=local_coords)
    return time.perf_counter() - start


def build_metrics(run: Run, start_step: int) -> tuple[MetricsProcessor, PeakFlops]:
    """The metrics processor, continuing at `start_step`, and the device's peak FLOPS it computes MFU against
    (from the hardware table, metrics.peak_tflops, or a short matmul calibration: docs/metrics.md)."""
    cfg = run.cfg
    peak = resolve_peak(run.device, run.kernel_dtype, cfg.metrics.peak_tflops)
    metrics = MetricsProcessor(
        cfg=cfg,
        dims=run.dims,
        device=run.device,
        rank=run.rank,
        flops_per_token=run.flops_per_token,
        float8_flops_per_token=run.fp8_flops_per_token,
        peak=peak,
        tokens_per_step_per_dp_rank=run.local_tokens,
        dump_folder=cfg.job.dump_folder,
        start_step=start_step,
        goodput=run.goodput,
    )
    return metrics, peak
