"""Test-only: let torch's context-parallel ring attention run on the CPU attention kernel.

torch's context parallel (torch.distributed.tensor.experimental.context_parallel) dispatches the CUDA SDPA kernels
(flash, efficient, cuDNN) to its ring attention; it has no entry for the CPU kernel
(aten._scaled_dot_product_flash_attention_for_cpu), so CP cannot run in CPU CI as shipped. `install()` adds that
entry to torch's own dispatch table, calling torch's own ring algorithm (`_templated_ring_attention` and its
backward, load balancing included) with the CPU kernel in place of the CUDA one. Everything else a CP run does,
buffer sharding, the trainer's loss and gradient reduction, FSDP over dp_shard x cp, is the production path.
The CPU kernel returns the same (out, logsumexp [B, H, S]) pair the ring merge expects; only the argument lists
differ, which the two adapters below translate. Never imported by the package: the trainer's
`cp_supported("cpu")` turns true only because this table entry exists.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.experimental._context_parallel import _attention as cp

aten = torch.ops.aten
FWD = aten._scaled_dot_product_flash_attention_for_cpu.default
BWD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
SEQ_DIM = 2  # q, k, v are [B, H, S, D]


def _kernel(query, key, value, is_causal, dropout_p=0.0, scale=None):
    return FWD(query, key, value, dropout_p, is_causal, scale=scale)


def _kernel_backward(grad_out, query, key, value, out, logsumexp, is_causal, dropout_p=0.0, scale=None):
    return BWD(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, scale=scale)


def _handler(op_call, args, kwargs):
    mesh = next(a.device_mesh for a in args if isinstance(a, DTensor))
    for a in args:
        if isinstance(a, DTensor) and a.placements != (Shard(SEQ_DIM),):
            raise AssertionError(f"CP CPU kernel expects Shard({SEQ_DIM}) inputs, got {a.placements}")
    if kwargs.get("attn_mask") is not None:
        raise NotImplementedError("CP CPU kernel: attn_mask is not supported (causal only)")
    local = [a.to_local() if isinstance(a, DTensor) else a for a in args]
    group = mesh.get_group()
    scale = kwargs.get("scale")
    if op_call is FWD:
        q, k, v, *rest = local
        dropout_p = rest[0] if rest else kwargs.get("dropout_p", 0.0)
        is_causal = rest[1] if len(rest) > 1 else kwargs.get("is_causal", False)
        results = cp._templated_ring_attention(
            group, SEQ_DIM, _kernel, q, k, v, is_causal=is_causal, dropout_p=dropout_p, scale=scale
        )
    else:
        grad_out, q, k, v, out, lse, dropout_p, is_causal = local
        results = cp._templated_ring_attention_backward(
            group,
            SEQ_DIM,
            _kernel_backward,
            grad_out=grad_out,
            grad_out_name="grad_out",
            query=q,
            key=k,
            value=v,
            out=out,
            logsumexp=lse,
            is_causal=is_causal,
            dropout_p=dropout_p,
            scale=scale,
        )
    return tuple(DTensor.from_local(t, mesh, [Shard(SEQ_DIM)], run_check=False) for t in results)


def install() -> None:
    """Register the CPU kernel with torch's CP dispatcher (idempotent)."""
    cp.custom_ops[FWD] = _handler
    cp.custom_ops[BWD] = _handler
