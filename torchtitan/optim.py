"""Optimizer, learning-rate schedule and gradient clipping."""

from __future__ import annotations

import math

import torch
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


@torch.no_grad()
def clip_grad_norm_(parameters, max_norm: float) -> torch.Tensor:
    """Clip to a global L2 norm and return the norm before clipping, as a plain (replicated) tensor.

    With FSDP the gradients are DTensors sharded over the data-parallel mesh; their norm is a DTensor whose
    `full_tensor()` reduces the partial sums across the shards, so every rank sees the same global norm.
    """
    parameters = [p for p in parameters if p.grad is not None]
    total = torch.nn.utils.get_total_norm([p.grad for p in parameters], foreach=True)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    if max_norm > 0:
        # takes the parameters (it scales each p.grad), not the gradients themselves
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total, foreach=True)
    return total
