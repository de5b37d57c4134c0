"""FSDP2 / HSDP: shard every transformer block and the root over the data-parallel mesh, with mixed precision.

A 1-D mesh gives FSDP (parameters sharded over all dp ranks); a 2-D (dp_replicate, dp_shard) mesh gives HSDP
(sharded within a group, replicated across groups: the all-gathers stay inside a node, and only the gradient
all-reduce crosses groups). Parameters that tensor parallelism already made DTensors on the "tp" mesh become
2-D (fsdp, tp) DTensors.
"""

from __future__ import annotations

import torch
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def apply_fsdp(
    model: torch.nn.Module,
    dp_mesh,
    param_dtype: str,
    reduce_dtype: str,
    reshard_after_forward: str,
    cpu_offload: bool = False,
):
    """fully_shard each block, then the root (which picks up embeddings, final norm and output head).

    Parameters are stored in fp32 (the optimizer's master copy) and all-gathered in `param_dtype`; gradients are
    reduce-scattered in `reduce_dtype`. The root is not resharded after forward under "default": backward needs
    its parameters immediately, so freeing them would only add an all-gather.

    Gradients are SUMMED over the data-parallel ranks, not averaged: the trainer already divides every token's
    loss by the global token count of the optimizer step (all ranks, all micro-steps), so the sum of the ranks'
    gradients is the gradient of the global mean loss. (FSDP's default average would divide by dp once more.)
    """
    mp = MixedPrecisionPolicy(param_dtype=_DTYPES[param_dtype], reduce_dtype=_DTYPES[reduce_dtype])
    kwargs = {"mesh": dp_mesh, "mp_policy": mp}
    if cpu_offload:
        # Parameters, gradients and hence the optimizer state live on the CPU; each block's parameters are
        # copied to the GPU for its all-gather and its gradients back after the reduce-scatter.
        kwargs["offload_policy"] = CPUOffloadPolicy()
    blocks_reshard = reshard_after_forward != "never"
    for block in model.layers.values():
        fully_shard(block, reshard_after_forward=blocks_reshard, **kwargs)
    fully_shard(model, reshard_after_forward=reshard_after_forward == "always", **kwargs)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            # plain SUM collectives (with the factor 1 FSDP would otherwise pick PREMUL_SUM, which gloo lacks)
            module.set_force_sum_reduction_for_comms(True)
    return model
