"""Optimizer, learning-rate schedule and gradient clipping."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def build_optimizer(model_parts: list[torch.nn.Module], cfg) -> torch.optim.Optimizer:
    """AdamW with decoupled weight decay on matrices only.

    Norm gains and the token embedding are not decayed (decaying a gain pulls it toward 0, which is not
    regularization; decaying embeddings penalizes rare tokens), the common practice for GPT-style training.
    """
    o = cfg.optimizer
    decay, no_decay = [], []
    named = [(name, p) for part in model_parts for name, p in part.named_parameters()]
    for name, p in named:
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "tok_embeddings" in name else decay).append(p)
    groups = [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    impl = {"foreach": {"foreach": True}, "fused": {"fused": True}, "for-loop": {"foreach": False}}[
        o.implementation
    ]
    return torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, **impl)


def lr_factor(
    step: int, total_steps: int, warmup_steps: int, decay_ratio, decay_type: str, min_lr_factor: float
) -> float:
    """Multiplier of the peak LR for optimizer step `step` (1-based): warmup -> stable -> decay.

    Warmup rises linearly to 1 over `warmup_steps` (step 1 gets 1/(warmup+1), never 0, so the first step learns).
    The decay phase is the last `decay_ratio` of the steps (all steps after warmup when decay_ratio is None) and
    falls linearly or along a half cosine to `min_lr_factor`, reached at the last step.
    """
    if step <= warmup_steps:
        return step / (warmup_steps + 1)
    decay_steps = total_steps - warmup_steps if decay_ratio is None else round(total_steps * decay_ratio)
    decay_start = total_steps - decay_steps
    if step <= decay_start or decay_steps <= 0:
        return 1.0
    progress = min(1.0, (step - decay_start) / decay_steps)
    if decay_type == "linear":
        shape = 1.0 - progress
    else:
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_lr_factor + (1.0 - min_lr_factor) * shape


def build_lr_scheduler(optimizer: torch.optim.Optimizer, cfg) -> torch.optim.lr_scheduler.LambdaLR:
    s = cfg.lr_scheduler
    steps = cfg.training.steps
    # LambdaLR calls the function with the number of scheduler.step() calls so far (0 before the first
    # optimizer step); +1 makes it the 1-based index of the optimizer step about to run.
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda i: lr_factor(i + 1, steps, s.warmup_steps, s.decay_ratio, s.decay_type, s.min_lr_factor),
    )


def _local_sum_of_squares(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Sum of squares of all elements of `tensors` (plain local tensors), as an fp64 scalar, without fp64 copies.

    Per-tensor (or per-row) L2 norms in the tensors' own dtype, then only those few partial results squared and
    summed in fp64. On CUDA one multi-tensor kernel (torch._foreach_norm) computes every norm; its blocked
    reduction is accurate to fp32 rounding. On CPU the norm kernel accumulates a tensor nearly sequentially:
    2e-5 relative error on a 0.5M-element fp32 gradient (measured), which alone would break the 1e-5 parity
    between layouts whose shards differ in size; so there each row (last dimension) gets its own norm, exact to
    fp32 rounding, and the row norms go to fp64. (The previous version converted every gradient to fp64: one
    extra pass and a 2x-sized copy per tensor.)
    """
    if tensors[0].device.type == "cpu":
        norms = torch.cat([torch.linalg.vector_norm(t, dim=-1).flatten() for t in tensors])
    else:
        norms = torch.stack(torch._foreach_norm(tensors))
    return norms.double().square().sum()


def _squared_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """Sum of squares of the full (global) gradients in `grads`, which share one mesh and one placement.

    Computed from the local shards, then summed over every mesh dimension the gradients are sharded on
    (replicated dimensions already hold the whole value, so they are not summed).
    """
    local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    sq = _local_sum_of_squares([t if t.ndim else t.reshape(1) for t in local])
    if isinstance(grads[0], DTensor):
        mesh, placements = grads[0].device_mesh, grads[0].placements
        for dim, placement in enumerate(placements):
            if placement.is_partial():
                raise RuntimeError(f"clip_grad_norm_: unreduced (Partial) gradient on mesh {mesh}")
            # any shard kind (FSDP over TP uses _StridedShard, for which is_shard() is False)
            if not placement.is_replicate() and mesh.size(dim) > 1:
                dist.all_reduce(sq, op=dist.ReduceOp.SUM, group=mesh.get_group(dim))
    return sq


@torch.no_grad()
def clip_grad_norm_(parameters, max_norm: float, pp_mesh=None) -> torch.Tensor:
    """Clip to the global L2 norm over every rank's gradients and return that norm (before clipping).

    Gradients are plain tensors (one data-parallel rank without TP: no FSDP) or DTensors, and then not all on
    one mesh or with one placement: with FSDP x TP the TP-sharded weights
    live on the 2-D (fsdp, tp) mesh, sharded on one or both dimensions, while norm gains without sequence
    parallel live on the 1-D fsdp mesh. The squared norm is computed per (mesh, placements) group and the groups
    are summed. Pipeline stages hold disjoint parameters, so with `pp_mesh` the stages' squared norms are summed
    by an all-reduce over it. Every rank ends up with the same norm and the same clip coefficient.
    """
    params = [p for p in parameters if p.grad is not None]
    groups: dict[tuple, list[torch.nn.Parameter]] = {}
    for p in params:
        key = (p.grad.device_mesh, p.grad.placements) if isinstance(p.grad, DTensor) else (None, None)
        groups.setdefault(key, []).append(p)
    device = params[0].grad.device if params else torch.device("cpu")
    total_sq = torch.zeros((), dtype=torch.float64, device=device)
    for group in groups.values():
        total_sq += _squared_norm([p.grad for p in group]).to(device)
    if pp_mesh is not None and pp_mesh.size() > 1:
        dist.all_reduce(total_sq, op=dist.ReduceOp.SUM, group=pp_mesh.get_group())
    total = total_sq.sqrt().float()
    if max_norm > 0:
        # one call per mesh (foreach kernels cannot mix meshes); it takes the parameters and scales each p.grad
        for group in groups.values():
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total, foreach=True)
    return total


@torch.no_grad()
def init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Allocate AdamW's state now (zeros, step 0), as its first step would lazily, so that step 1 does not pay for
    it and the time is reported in the run header. A checkpoint load then fills the same tensors.

    Mirrors torch.optim.Adam._init_group (tests/test_optim.py compares against a real first step): `step` lives on
    the parameter's device for fused/capturable AdamW, else on the CPU.
    """
    from torch.optim.optimizer import _get_scalar_dtype

    if not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return  # another optimizer keeps its lazy initialization
    for group in optimizer.param_groups:
        on_device = group["fused"] or group["capturable"]
        for p in group["params"]:
            if not p.requires_grad or optimizer.state[p]:
                continue
            state = optimizer.state[p]
            if on_device:
                state["step"] = torch.zeros(
                    (), dtype=_get_scalar_dtype(is_fused=group["fused"]), device=p.device
                )
            else:
                state["step"] = torch.tensor(0.0, dtype=_get_scalar_dtype(), device="cpu")
            names = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if group["amsgrad"] else [])
            for name in names:
                state[name] = torch.zeros_like(p, memory_format=torch.preserve_format)
