"""The training objective: the loss, and one micro-batch's forward and backward.

Its own module because three places share it: the loop (train.py), the held-out evaluation (evaluate.py, the
same loss with global_tokens=1: a plain token sum) and the pipeline schedules (the loss each last stage runs).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from torchtitan.parallel.pipeline import pipeline_forward_backward


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
