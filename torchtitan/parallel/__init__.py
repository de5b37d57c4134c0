"""Parallelism applied to an already-built model. The model itself knows nothing about any of it.

`parallelize` applies the techniques in one fixed order; `materialize` allocates the parallelized model and
`local_coords` tells the layout-independent init which elements of each parameter this rank holds.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import _StridedShard

from torchtitan.quantize.cpu_float8 import use_fp32_scaled_mm_on_cpu
from torchtitan.quantize.float8 import convert_to_float8

from .activation_checkpoint import apply_ac
from .attention import apply_gqa_choice
from .compile import apply_compile
from .cpu_bf16 import apply_cpu_bf16_kernels, matmul_dtype
from .dims import ParallelDims
from .distributed import init_distributed, pick_device, set_collective_timeout
from .fsdp import apply_fsdp
from .mixed_precision import DTYPES, apply_autocast
from .pipeline import build_pipeline, pipeline_forward_backward, plan_pipeline
from .tensor import apply_tp, reduce_partial_grads

__all__ = [
    "ParallelDims",
    "init_distributed",
    "pick_device",
    "set_collective_timeout",
    "parallelize",
    "local_coords",
    "fill_shard",
    "materialize",
    "reduce_partial_grads",
    "pipeline_parallelize",
    "pipeline_forward_backward",
    "plan_pipeline",
]


def parallelize(model: torch.nn.Module, dims: ParallelDims, cfg) -> torch.nn.Module:
    """Apply parallelism to a model built on the meta device, in this fixed order (docs/parallelism.md):

        1. float8 conversion of linear layers                          - torchao; swaps nn.Linear modules
           (on a CPU its float8 matmuls take fp32 kernels                 - quantize/cpu_float8.py)
           or, bf16 on a CPU without bf16 instructions, fp32 kernels      - cpu_bf16.py; swaps nn.Linear classes
        2. tensor parallel (+ sequence/loss parallel)  on mesh "tp"
        3. activation checkpointing                                    - wraps blocks
        4. torch.compile per block                                     - compiles the wrapped block
        5. FSDP2 / HSDP                                  on mesh "fsdp" - last: shards whatever parameters exist
           or, when nothing is sharded or replicated, autocast         - mixed precision without FSDP

    float8 before TP: it replaces nn.Linear modules; torchao's float8 TP styles accept only Float8Linear, the
    filter must see unsharded shapes, and TP/AC/compile/FSDP must act on the modules that will actually run.
    AC before compile, so the checkpointed region (and a selective policy) is traced into the block's graph;
    compile before FSDP2, so FSDP's hooks wrap the compiled block. With one data-parallel rank (one process,
    TP-only, PP-only) FSDP would shard nothing and cost 8-18 % of a step: bf16 then comes from torch.autocast
    (mixed_precision.py), unless CPU offload (an FSDP feature) is asked for.
    """
    p, t = cfg.parallelism, cfg.training
    device_type = dims.mesh("world").device_type
    if cfg.float8.enable:
        convert_to_float8(model, cfg)  # imports torchao (optional) only here
        if device_type == "cpu":
            use_fp32_scaled_mm_on_cpu()  # oneDNN's float8 matmul is a reference kernel on some CPUs
    compute_dtype = DTYPES[t.mixed_precision_param]
    kernel_dtype = matmul_dtype(device_type, compute_dtype, t.cpu_bf16_fp32_kernels)
    if kernel_dtype != compute_dtype:
        apply_cpu_bf16_kernels(model)
    apply_gqa_choice(model, device_type, kernel_dtype)
    if dims.tp_enabled:
        apply_tp(model, dims.mesh("tp"), p.enable_sequence_parallel, p.enable_loss_parallel)
    apply_ac(model, cfg.activation_checkpoint.mode, cfg.activation_checkpoint.selective_ac_option)
    if cfg.compile.enable and "model" in cfg.compile.components:
        apply_compile(model)
    if not (dims.fsdp_enabled or p.fsdp_cpu_offload):
        return apply_autocast(model, device_type, t.mixed_precision_param)
    reshard = p.fsdp_reshard_after_forward
    if dims.pp_enabled and reshard == "default":
        # Each micro-batch would all-gather the stage's blocks again; and zero-bubble schedules lose weight
        # gradients of blocks resharded after forward (see pipeline.py). Keep them gathered until backward.
        reshard = "never"
    if dims.dp_shard * dims.cp == 1 and reshard == "default":
        # Nothing is sharded (pure replication, or CPU offload on one rank): resharding would only free the
        # low-precision copy and cast it again for backward (measured: 4% of the debug model's step on CPU).
        reshard = "never"
    apply_fsdp(
        model,
        dims.mesh("fsdp"),
        param_dtype=t.mixed_precision_param,
        reduce_dtype=t.mixed_precision_reduce,
        reshard_after_forward=reshard,
        cpu_offload=p.fsdp_cpu_offload,
    )
    return model


def pipeline_parallelize(
    model: torch.nn.Module, plan, dims: ParallelDims, cfg, device, loss_fn, make_stage=None
):
    """Split the meta-device model into this rank's pipeline stages, `parallelize` each one, build the schedule.

    Returns (schedule, model_parts, has_first_stage, has_last_stage); see pipeline.py.
    """
    return build_pipeline(
        model, plan, dims.mesh("pp"), device, lambda stage: parallelize(stage, dims, cfg), loss_fn, make_stage
    )


def local_coords(param: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """This process's part of `param` and, per dimension, the indices in the full parameter that part covers.

    The init (`Transformer.init_weights(seed, local_coords=local_coords)`) then computes exactly those elements.
    A Shard-type placement splits one dimension, so a DTensor's local shard is always the cartesian product of
    per-dimension index sets. Each set comes from distributing the small vector arange(size of that dimension)
    with the parameter's own placements moved onto it (Shard(d)/_StridedShard(d) of this dimension -> dim 0, other
    dimensions' shards -> Replicate): torch's own chunking decides, for FSDP Shard(0), TP Shard(0)/Shard(1), the
    strided FSDP x TP shard and uneven splits alike, at a cost of sum(shape) elements, not prod(shape), and without
    communication (src_data_rank=None slices locally).
    """
    if not isinstance(param, DTensor):
        return param, [torch.arange(n, device=param.device) for n in param.shape]
    local = param.to_local()
    coords = []
    for dim, size in enumerate(param.shape):
        along = [_placement_along(p, dim) for p in param.placements]
        # on the mesh's device: under FSDP CPU offload the values are computed on the GPU, then copied to the CPU
        index = torch.arange(size, device=param.device_mesh.device_type)
        coords.append(distribute_tensor(index, param.device_mesh, along, src_data_rank=None).to_local())
    return local, coords


def fill_shard(param: torch.Tensor, full_value: torch.Tensor) -> None:
    """Copy this rank's part of a parameter's full (unsharded) value into it (loading full weights, e.g. for
    generation under tensor parallelism). `distribute_tensor(..., src_data_rank=None)` slices locally with the
    parameter's own chunking, so no communication happens."""
    if isinstance(param, DTensor):
        full_value = full_value.to(device=param.device, dtype=param.dtype)
        local = distribute_tensor(full_value, param.device_mesh, param.placements, src_data_rank=None)
        param.to_local().copy_(local.to_local())
    else:
        param.copy_(full_value)


def _placement_along(placement, dim: int):
    """`placement` of a parameter, seen from the 1-D vector of its dimension `dim`'s indices."""
    if isinstance(placement, _StridedShard):  # before Shard: in some torch versions it subclasses Shard
        return _StridedShard(0, split_factor=placement.split_factor) if placement.dim == dim else Replicate()
    if isinstance(placement, Shard):
        return Shard(0) if placement.dim == dim else Replicate()
    if placement.is_replicate():
        return Replicate()
    raise ValueError(f"local_coords: parameter placement {placement} is not a shard or a replica")


def materialize(model: torch.nn.Module, device: torch.device, cpu_offload: bool = False) -> None:
    """Allocate a meta-device model's storage (uninitialized) and compute its RoPE table on `device`.

    Under FSDP CPU offload the parameters live in CPU memory (FSDP copies each block to the GPU itself), but
    buffers are not FSDP's: the RoPE table must be on the compute device, or the first forward mixes devices.
    """
    model.to_empty(device="cpu" if cpu_offload else device)
    model.init_buffers(device)
