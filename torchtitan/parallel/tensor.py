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

Float8 (tensorwise recipe; conversion runs before this): the block linears that are tensorwise Float8Linear take
torchao's Float8ColwiseParallel / Float8RowwiseParallel (via quantize.float8.float8_tp_style), and the inputs
of "attention" / "feed_forward" take torchao's PrepareFloat8ModuleInput when all their column-wise linears are
such modules: the activation is cast to float8 once, before the sequence-parallel all-gather, so the
all-gather moves 1 byte per element instead of 2 and wq/wk/wv (w1/w3) share the gathered float8 tensor. The
row-wise outputs (wo, w2) are still reduced (reduce-scattered with sequence parallel) in high precision; in the
backward the gradient reaching wo / w2's output is cast to float8 before its all-gather, so both directions'
all-gathers are float8. The rowwise recipe and linears the float8 filter skipped keep torch's plain styles
(high-precision collectives). So does a CPU tp mesh on gloo, which cannot carry float8 dtypes ("Invalid scalar
type"): there float8 still computes, after a high-precision all-gather.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from torchtitan.log import logger
from torchtitan.quantize.float8 import float8_tp_style, is_tensorwise_float8


def float8_collectives(tp_mesh) -> bool:
    """Whether collectives on `tp_mesh` can carry float8 tensors: not on gloo (CPU), which rejects the dtypes."""
    backend = dist.get_backend(tp_mesh.get_group())
    return not (backend == "gloo" or (tp_mesh.device_type == "cpu" and "gloo" in backend))


def _materialize_async_output(module, args, output):
    """The embedding's reduce-scatter runs asynchronously (RowwiseParallel's output redistribute), so its output is
    an AsyncCollectiveTensor until first used. Passed as such into a compiled block, the block's backward hands a
    plain tensor to DTensor's Redistribute backward (torch 2.13: "'Tensor' object has no attribute
    '_local_tensor'", found by session 30's held-out CPU run); one copy of the stream here gives the block an
    ordinary tensor and keeps the gradient's path through to_local and the redistribute."""
    return output.clone() if isinstance(output, AsyncCollectiveTensor) else output


def _prepare_input(module: torch.nn.Module, colwise: tuple[str, ...], input_layouts, desired_input_layouts):
    """PrepareModuleInput for `module`, or torchao's float8 variant when every linear in `colwise` (the ones
    that consume this input) is a tensorwise Float8Linear: then the input is cast to float8 before it is
    redistributed (all-gathered with sequence parallel). If any consumer stayed high precision the input must
    too (a plain linear cannot take a float8 tensor), and the all-gather is bf16."""
    if all(is_tensorwise_float8(module.get_submodule(name)) for name in colwise):
        from torchao.float8.float8_tensor_parallel import PrepareFloat8ModuleInput

        # The cast uses the float8 config of one consumer (all of them share the recipe's config).
        return PrepareFloat8ModuleInput(
            input_layouts=input_layouts,
            desired_input_layouts=desired_input_layouts,
            float8_dtype=torch.float8_e4m3fn,
            fwd_config_submodule_fqn=colwise[0],
        )
    return PrepareModuleInput(input_layouts=input_layouts, desired_input_layouts=desired_input_layouts)


def apply_tp(
    model: torch.nn.Module,
    tp_mesh,
    sequence_parallel: bool,
    loss_parallel: bool,
    float8_styles: bool | None = None,
) -> None:
    """Shard `model` (on the meta device) over `tp_mesh` in place.

    float8_styles: use torchao's float8 TP styles for tensorwise Float8Linear modules (see the module
    docstring); None (default) means "where the mesh's backend can carry float8" (float8_collectives)."""
    if float8_styles is None:
        float8_styles = float8_collectives(tp_mesh)
        if not float8_styles and any(is_tensorwise_float8(m) for m in model.modules()):
            logger.info(
                "float8 + TP: %s cannot all-gather float8; TP collectives stay high precision",
                dist.get_backend(tp_mesh.get_group()),
            )
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
    if model.tok_embeddings is not None:
        model.tok_embeddings.register_forward_hook(_materialize_async_output)

    def colwise(linear):
        return float8_tp_style(linear, "colwise") if float8_styles else ColwiseParallel()

    def rowwise(linear):
        if float8_styles:
            return float8_tp_style(linear, "rowwise", output_layouts=stream)
        return RowwiseParallel(output_layouts=stream)

    def prepare(module, consumers, input_layouts, desired_input_layouts):
        if float8_styles:
            return _prepare_input(module, consumers, input_layouts, desired_input_layouts)
        return PrepareModuleInput(input_layouts=input_layouts, desired_input_layouts=desired_input_layouts)

    for block in model.layers.values():
        attn, ff = block.attention, block.feed_forward
        plan = {
            # freqs_cis (second argument) stays a plain, full tensor: attention sees the whole sequence.
            "attention": prepare(attn, ("wq", "wk", "wv"), (stream, None), (Replicate(), None)),
            "attention.wq": colwise(attn.wq),
            "attention.wk": colwise(attn.wk),
            "attention.wv": colwise(attn.wv),
            "attention.wo": rowwise(attn.wo),
            "feed_forward": prepare(ff, ("w1", "w3"), (stream,), (Replicate(),)),
            "feed_forward.w1": colwise(ff.w1),
            "feed_forward.w3": colwise(ff.w3),
            "feed_forward.w2": rowwise(ff.w2),
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
