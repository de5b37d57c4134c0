"""Mixed precision where FSDP is not applied: torch.autocast around the model's forward.

With data parallelism, FSDP2 keeps fp32 parameters and gathers them in `training.mixed_precision_param` (see
fsdp.py). With one data-parallel rank (one process, or TP-only / PP-only layouts) nothing is sharded or
replicated, and FSDP2's machinery (hooks, DTensor parameters in the optimizer, copies) cost 8-18 % of the debug
model's step on CPU for nothing; `parallelize` then leaves FSDP out and mixed precision comes from autocast, as
in torchtitan: parameters, gradients and optimizer state stay fp32, and inside the forward autocast runs matmuls
and attention in bf16 (each weight cast once per forward: autocast caches the casts of parameters), while the
ops autocast keeps in fp32 and the residual stream between blocks (embedding output plus bf16 block outputs
promotes to fp32) stay fp32. docs/parallelism.md compares the two policies' losses.
"""

from __future__ import annotations

import torch

from torchtitan.log import logger

# training.mixed_precision_param / mixed_precision_reduce -> dtype (also used by fsdp.py)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def apply_autocast(model: torch.nn.Module, device_type: str, param_dtype: str) -> torch.nn.Module:
    """Run `model`'s forward under torch.autocast(device_type, param_dtype); nothing to do for float32.

    Hooks rather than a wrapper module, so parameter names and the module tree stay as they are (checkpoints,
    init and pipeline stages see the plain model). The exit hook runs even when forward raises (always_call).
    Backward runs outside autocast and uses the dtypes forward chose, as torch recommends.
    """
    dtype = DTYPES[param_dtype]
    logger.info(
        "mixed precision: %s (no FSDP: one data-parallel rank, nothing sharded)",
        "none, fp32"
        if dtype == torch.float32
        else f"torch.autocast({dtype}) around forward, fp32 parameters",
    )
    if dtype == torch.float32:
        return model
    active: list[torch.autocast] = []

    def enter(module, args):
        ctx = torch.autocast(device_type, dtype=dtype)
        ctx.__enter__()
        active.append(ctx)

    def leave(module, args, output):
        active.pop().__exit__(None, None, None)

    model.register_forward_pre_hook(enter)
    model.register_forward_hook(leave, always_call=True)
    return model
