"""FSDP2 / HSDP: shard the embedding, every transformer block, the head and the root over the data-parallel mesh,
with mixed precision.

A 1-D mesh gives FSDP (parameters sharded over all dp ranks); a 2-D (dp_replicate, dp_shard) mesh gives HSDP
(sharded within a group, replicated across groups: the all-gathers stay inside a node, and only the gradient
all-reduce crosses groups). Parameters that tensor parallelism already made DTensors on the "tp" mesh become
2-D (fsdp, tp) DTensors.
"""

from __future__ import annotations

import torch
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

from torchtitan.log import logger

from .mixed_precision import DTYPES


def apply_fsdp(
    model: torch.nn.Module,
    dp_mesh,
    param_dtype: str,
    reduce_dtype: str,
    reshard_after_forward: str,
    cpu_offload: bool = False,
):
    """fully_shard the embedding, each block and the norm + output head as their own units, then the root.

    Units, in forward order (each is one all-gather in forward and one reduce-scatter in backward):

        tok_embeddings -> layers.0 -> ... -> layers.{n-1} -> [norm, output]        root: whatever is left

    Backward visits them in reverse, and FSDP2 prefetches the next unit's all-gather while the current one
    computes (backward prefetch, on by default; in forward the all-gather of unit i+1 is issued when unit i's
    forward starts running on the GPU stream). Separate units matter at scale: in a root holding embedding,
    norm and output together (2 x vocab x dim, ~1 B parameters for Llama 3 8B), the whole group was gathered
    before the first block and held through the step, and its reduce-scatter waited for the embedding gradient
    at the very end of backward, exposed. Now the embedding is gathered around its lookup (and again for its
    backward, last), the head from the end of forward through its backward, and the head's reduce-scatter
    overlaps the blocks' backward. The head unit is not resharded after forward: backward needs it at once.
    With tied embeddings the output matmul uses tok_embeddings.weight, so the embedding (and the norm) stay in
    the root's group, which is gathered for the whole forward and backward (model.py).

    Parameters are stored in fp32 (the optimizer's master copy) and all-gathered in `param_dtype`; gradients are
    reduce-scattered in `reduce_dtype`.

    Gradients are SUMMED over the data-parallel ranks, not averaged: the trainer already divides every token's
    loss by the global token count of the optimizer step (all ranks, all micro-steps), so the sum of the ranks'
    gradients is the gradient of the global mean loss. (FSDP's default average would divide by dp once more.)
    """
    mp = MixedPrecisionPolicy(param_dtype=DTYPES[param_dtype], reduce_dtype=DTYPES[reduce_dtype])
    kwargs = {"mesh": dp_mesh, "mp_policy": mp}
    if cpu_offload:
        # Parameters, gradients and hence the optimizer state live on the CPU; each block's parameters are
        # copied to the GPU for its all-gather and its gradients back after the reduce-scatter.
        kwargs["offload_policy"] = CPUOffloadPolicy()
    blocks_reshard = reshard_after_forward != "never"
    tied = model.output is None and getattr(model.args, "tie_embeddings", False)
    if model.tok_embeddings is not None and not tied:
        fully_shard(model.tok_embeddings, reshard_after_forward=blocks_reshard, **kwargs)
    for block in model.layers.values():
        fully_shard(block, reshard_after_forward=blocks_reshard, **kwargs)
    if model.norm is not None and model.output is not None:
        fully_shard([model.norm, model.output], reshard_after_forward=False, **kwargs)
    fully_shard(model, reshard_after_forward=reshard_after_forward == "always", **kwargs)
    units = [name or "root" for name, module in model.named_modules() if isinstance(module, FSDPModule)]
    logger.info("FSDP2 units (%s, mesh %s): %s", param_dtype, tuple(dp_mesh.shape), ", ".join(units))
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            # plain SUM collectives (with the factor 1 FSDP would otherwise pick PREMUL_SUM, which gloo lacks)
            module.set_force_sum_reduction_for_comms(True)
    return model
