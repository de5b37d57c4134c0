"""Activation checkpointing: trade recomputation in backward for activation memory, per transformer block.

[activation_checkpoint] mode:
  none       keep every activation (fastest, most memory)
  full       keep only each block's input; backward re-runs the whole block forward
  selective  selective_ac_option = "N" (an integer as a string): full checkpointing of every N-th block
             (blocks N-1, 2N-1, ...; "1" is the same as full)
             selective_ac_option = "op": every block is checkpointed, but the outputs of the ops in
             SAVE_OPS are kept, except every second matmul of the block (the 2nd, 4th, 6th: wk, wo, w3),
             which is recomputed with the cheap elementwise ops between them (norms, RoPE, SiLU, residual
             adds). This is torchtitan's published per-op policy; docs/activation_checkpointing.md has its
             memory and recompute figures.

Wrapping inserts "_checkpoint_wrapped_module." into parameter names. That is harmless: torch's CheckpointWrapper
strips it from state_dict() keys (and adds it back on load), DCP's state-dict helpers normalize it, and
Transformer.init_weights removes it before seeding, so init, checkpoints and parity do not see the wrapper.
Recomputation uses the same kernels on the same inputs, so losses are bitwise equal to a run without AC
(tests/test_activation_checkpoint.py checks it).
"""

from __future__ import annotations

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from torchtitan.log import logger

_aten = torch.ops.aten


def _existing(namespace, names: list[str]) -> list:
    """The default overloads of the ops that exist in this torch build (the SDPA variants vary by version)."""
    return [getattr(namespace, n).default for n in names if hasattr(namespace, n)]


# The save list of selective per-op AC -- the one place it is defined (docs/activation_checkpointing.md cites it).
# Saved: ops whose recomputation is expensive relative to the memory their output takes.
SAVE_OPS = set(
    # Matmuls: every linear layer lowers to one of these; they are ~all of a block's FLOPs.
    _existing(_aten, ["mm", "addmm", "bmm", "baddbmm"])
    # Attention: O(seq^2) work per head; each backend is a separate op (flash/efficient/cudnn on CUDA, the
    # flash-for-cpu kernel on CPU, the fused "overrideable" entry for out-of-tree devices).
    + _existing(
        _aten,
        [
            "_scaled_dot_product_flash_attention",
            "_scaled_dot_product_efficient_attention",
            "_scaled_dot_product_cudnn_attention",
            "_scaled_dot_product_flash_attention_for_cpu",
            "_scaled_dot_product_fused_attention_overrideable",
        ],
    )
    # Float8 matmul. torchao's float8 linears reach this policy as aten.mm on its float8 tensor subclass (the
    # subclass calls _scaled_mm beneath the policy), so mm already covers them; this is for direct callers.
    + _existing(_aten, ["_scaled_mm"])
    # Reduction: torchao's dynamic float8 scaling takes abs().max() of each input and weight -- a full pass over
    # the tensor whose output is one scalar (or one per row), so keeping it costs nothing; under float8 TP/FSDP
    # an all-reduce of that amax follows, which recompute would have to repeat.
    + _existing(_aten, ["max", "amax"])
    # Tensor-parallel reduce-scatter (sequence parallel output of wo/w2): recomputing it means communicating
    # again, in backward, on the critical path.
    + _existing(torch.ops._c10d_functional, ["reduce_scatter_tensor"])
)


# The matmuls the every-second rule counts (every linear layer is one of these).
_MATMULS = set(_existing(_aten, ["mm", "addmm"]))


def _save_policy():
    """A fresh per-op policy for one checkpointed call: keep SAVE_OPS outputs, except every second matmul.

    The forward and the recompute in backward each number the block's matmuls from 1 (ctx.is_recompute tells
    them apart) and run the same ops in the same order, so both agree on which outputs are cached. Odd ones
    are saved, even ones recomputed: in a Llama block (wq wk wv wo w1 w3 w2) that recomputes wk, wo and w3,
    37 % of the block's forward matmul FLOPs (debug and 8B shapes alike), and keeps 4 of the 7 matmul outputs.
    """
    count = {False: 0, True: 0}

    def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
        if op in _MATMULS:
            count[ctx.is_recompute] += 1
            if count[ctx.is_recompute] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if op in SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _selective_contexts():
    return create_selective_checkpoint_contexts(_save_policy())


def _wrap(block: torch.nn.Module, per_op: bool) -> torch.nn.Module:
    kwargs = {}
    if per_op:
        # A fresh pair of contexts (and matmul count) per checkpointed call: the cache of saved outputs is per
        # forward.
        kwargs["context_fn"] = _selective_contexts
    # Non-reentrant checkpointing: the variant that supports selective contexts, torch.compile, FSDP2 and DTensor.
    # preserve_rng_state=False: the blocks use no randomness (no dropout), so stashing RNG state is wasted work.
    return checkpoint_wrapper(
        block, checkpoint_impl=CheckpointImpl.NO_REENTRANT, preserve_rng_state=False, **kwargs
    )


def apply_ac(model: torch.nn.Module, mode: str, selective_ac_option: str = "op") -> torch.nn.Module:
    """Wrap the blocks of `model.layers` (in place, same keys) according to the [activation_checkpoint] config."""
    if mode == "none":
        return model
    every = 1
    per_op = mode == "selective" and selective_ac_option == "op"
    if mode == "selective" and not per_op:
        every = int(selective_ac_option)  # validated in config.validate: a positive integer
    wrapped = []
    # Count over this module's blocks in order; a pipeline stage counts its own blocks from its first one.
    for i, (name, block) in enumerate(list(model.layers.items())):
        if (i + 1) % every == 0:
            model.layers[name] = _wrap(block, per_op)
            wrapped.append(name)
    how = "selective per-op" if per_op else ("full" if every == 1 else f"every {every}-th block")
    logger.info("activation checkpointing (%s): blocks %s", how, ", ".join(wrapped) or "none")
    return model
