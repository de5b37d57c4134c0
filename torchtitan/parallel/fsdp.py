"""FSDP2: shard every transformer block and the root over the data-parallel mesh, with mixed precision."""

from __future__ import annotations

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def apply_fsdp(
    model: torch.nn.Module, dp_mesh, param_dtype: str, reduce_dtype: str, reshard_after_forward: str
):
    """fully_shard each block, then the root (which picks up embeddings, final norm and output head).

    Parameters are stored in fp32 (the optimizer's master copy) and all-gathered in `param_dtype`; gradients are
    reduce-scattered in `reduce_dtype`. The root is not resharded after forward under "default": backward needs
    its parameters immediately, so freeing them would only add an all-gather.
    """
    mp = MixedPrecisionPolicy(param_dtype=_DTYPES[param_dtype], reduce_dtype=_DTYPES[reduce_dtype])
    blocks_reshard = reshard_after_forward != "never"
    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=blocks_reshard)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward == "always")
    return model
