"""Grouped-query attention: SDPA's native GQA where a fused kernel does it, else repeat_kv.

`F.scaled_dot_product_attention(..., enable_gqa=True)` lets the kernel read each key/value head for its n_rep
query heads; the alternative, repeat_kv, materialises n_rep copies of K and V (4x for Llama 3 8B, 8x for 70B),
which autograd keeps for backward and which context parallel's ring would pass between ranks. Not every
backend does GQA natively: where SDPA would answer enable_gqa with its math fallback (which repeats K/V itself
and builds the full S x S score matrix) while the repeated tensors could still use a fused kernel (e.g. fp32 on
CUDA, where flash attention does not apply), repeat_kv is the better path. torch decides which kernel it would
run for given inputs (`torch._fused_sdp_choice`), so we ask it once, with inputs shaped like the model's, on the
run's device type and compute dtype, rather than keeping a table of versions and backends.
"""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend

from torchtitan.log import logger


def native_gqa_supported(device_type: str, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether SDPA runs grouped-query attention in a fused kernel (not the math fallback) for such inputs."""
    try:
        q = torch.zeros(1, 2, 16, head_dim, device=device_type, dtype=dtype, requires_grad=True)
        kv = torch.zeros(1, 1, 16, head_dim, device=device_type, dtype=dtype, requires_grad=True)
        backend = torch._fused_sdp_choice(q, kv, kv, None, 0.0, True, enable_gqa=True)
    except (RuntimeError, TypeError, AttributeError):  # a torch without the probe or without enable_gqa
        return False
    return backend != int(SDPBackend.MATH)


def apply_gqa_choice(model: torch.nn.Module, device_type: str, dtype: torch.dtype) -> bool:
    """Set every block's Attention.native_gqa for this device and compute dtype; returns the choice."""
    blocks = list(model.layers.values())
    if not blocks or blocks[0].attention.n_rep == 1:
        return False  # multi-head attention: nothing to repeat
    native = native_gqa_supported(device_type, dtype, blocks[0].attention.head_dim)
    for block in blocks:
        block.attention.native_gqa = native
    logger.info(
        "attention: %s",
        "SDPA native grouped-query attention"
        if native
        else f"repeat_kv (SDPA has no fused GQA kernel for {device_type} {dtype})",
    )
    return native
