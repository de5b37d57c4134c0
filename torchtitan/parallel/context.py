"""Context parallel: each micro-batch's sequence split over the `cp` mesh, attention computed as a ring.

torch's `context_parallel` does the work: it shards the listed buffers on their sequence dimension (with causal
load balancing: rank r keeps chunks r and 2*cp-1-r of 2*cp, so every rank has the same share of the causal
triangle) and, inside the context, routes `F.scaled_dot_product_attention` to its ring attention, which passes
key/value shards between the cp ranks (all-gather or all-to-all, `context_parallel_rotate_method`). Everything
outside attention is position-wise, so the model needs no change. The buffers are the token ids, the labels and
each model part's RoPE table cut to `seq_len` (so it has the same sequence length as the tokens and is sharded
with the same permutation). Gradients of the cp ranks add up because FSDP shards over dp_shard x cp with a sum
reduction, and the loss is each rank's token sum over the step's global token count, as without CP.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch
from torch.distributed.tensor.experimental import context_parallel
from torch.distributed.tensor.experimental._attention import set_rotate_method

if TYPE_CHECKING:
    from torchtitan.parallel.dims import ParallelDims


def build_cp_context(
    dims: ParallelDims, rotate_method: str, model_parts: list[torch.nn.Module], seq_len: int
):
    """A function (inputs, labels) -> context manager to run one micro-batch's forward AND backward under.

    With CP, entering it shards `inputs` and `labels` in place to this rank's seq_len / cp tokens (they are not
    restored: the next micro-batch brings new ones). Without CP it is a no-op.
    """
    if not dims.cp_enabled:
        return lambda inputs, labels: contextlib.nullcontext()
    set_rotate_method(rotate_method)
    mesh = dims.mesh("cp")

    @contextlib.contextmanager
    def cp_context(inputs: torch.Tensor, labels: torch.Tensor):
        tables = [part.freqs_cis for part in model_parts]
        ropes = [table[:seq_len].clone() for table in tables]  # seq_len x head_dim/2 x 2 floats: cheap
        for part, rope in zip(model_parts, ropes):
            part.freqs_cis = rope  # a registered buffer: attribute assignment replaces it
        buffers = [inputs, labels, *ropes]
        try:
            with context_parallel(
                mesh,
                buffers=buffers,
                buffer_seq_dims=[1, 1] + [0] * len(ropes),
                no_restore_buffers=set(buffers),
            ):
                yield
        finally:
            for part, table in zip(model_parts, tables):
                part.freqs_cis = table

    return cp_context
