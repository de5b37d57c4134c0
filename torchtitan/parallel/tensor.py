"""Tensor parallelism (Megatron-style) with sequence parallel and loss parallel, as DTensor plans.

Per block, on the "tp" mesh:

    attention:    wq, wk, wv column-wise (each rank gets n_heads/tp query and n_kv_heads/tp kv heads),
                  wo row-wise (partial sums of the output, reduced once)
    feed_forward: w1, w3 column-wise, w2 row-wise

so each block needs one reduction after attention and one after the MLP (Shoeybi et al. 2019, Megatron-LM).
The model infers its head count from the projection width, so nothing inside the model changes.

Sequence parallel (Korthikanti et al. 2022) shards what is between those reductions, the residual stream and
the RMSNorms, on the sequence dimension: the all-reduce becomes a reduce-scatter (into Shard(1)) plus an
all-gather (before the next column-wise matmul), the same bytes moved, but norms and residual adds run on 1/tp
of the tokens and their activations take 1/tp of the memory.

Loss parallel keeps the output projection's logits sharded on the vocabulary; `loss_parallel()` computes the
cross-entropy from the shards (a max and a sum-exp across ranks) instead of gathering [B, S, vocab] logits.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)


def apply_tp(model: torch.nn.Module, tp_mesh, sequence_parallel: bool, loss_parallel: bool) -> None:
    """Shard `model` (on the meta device) over `tp_mesh` in place."""
    # Layout of the residual stream between blocks: sharded on the sequence, or replicated.
    stream = Shard(1) if sequence_parallel else Replicate()

    top = {}
    if model.tok_embeddings is not None:
        # Row-wise on the embedding table shards the vocabulary; each rank looks up its rows and the partial
        # results are reduce-scattered straight into the stream's layout.
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=stream)
    if model.norm is not None and sequence_parallel:
        top["norm"] = SequenceParallel()
    if model.output is not None:
        top["output"] = ColwiseParallel(
            input_layouts=stream,
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            # Loss parallel needs the DTensor (it carries the vocab sharding into the loss); otherwise the
            # gathered logits are an ordinary tensor.
            use_local_output=not loss_parallel,
        )
    if top:
        parallelize_module(model, tp_mesh, top)

    for block in model.layers.values():
        plan = {
            # freqs_cis (second argument) stays a plain, full tensor: attention sees the whole sequence.
            "attention": PrepareModuleInput(
                input_layouts=(stream, None), desired_input_layouts=(Replicate(), None)
            ),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=stream),
            "feed_forward": PrepareModuleInput(input_layouts=(stream,), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=stream),
        }
        if sequence_parallel:
            plan["attention_norm"] = SequenceParallel()
            plan["ffn_norm"] = SequenceParallel()
        parallelize_module(block, tp_mesh, plan)


@torch.no_grad()
def reduce_partial_grads(model_parts: list[torch.nn.Module]) -> None:
    """Make every gradient hold its full value before it is clipped and applied.

    Under tensor parallelism the replicated parameters used on sequence-sharded activations (the norm gains with
    sequence parallel) get Partial gradients: each tp rank holds its own tokens' share. FSDP2 all-reduces such a
    gradient to its parameter's placement when it reduces gradients; without FSDP (one data-parallel rank) this
    does the same, one all-reduce per such gradient. A no-op when no gradient is Partial.
    """
    for part in model_parts:
        for p in part.parameters():
            g = p.grad
            if isinstance(g, DTensor) and any(pl.is_partial() for pl in g.placements):
                p.grad = g.redistribute(g.device_mesh, p.placements)
