"""torch.compile, one transformer block at a time (and the loss, optionally).

Why per block rather than the whole model: all blocks have the same code and shapes, and dynamo treats their
parameters as inputs (inline_inbuilt_nn_modules, default since torch 2.5), so one compiled graph serves every
block: compile time does not grow with depth. FSDP2's all-gather/reduce-scatter hooks stay outside the graph
(they are registered on the block and dynamo skips FSDP hooks), so communication overlaps as without compile.

`Module.compile()` compiles in place: the block keeps its class position and its parameter names (no
"_orig_mod." infix as with `torch.compile(module)`), so state dicts and DCP checkpoints are the same with or
without compile. It must run after activation checkpointing (so the checkpoint region, including a selective
policy, is traced as part of the graph) and before fully_shard (FSDP2's hooks then wrap the compiled call).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from torchtitan.log import logger


def apply_compile(model: torch.nn.Module) -> torch.nn.Module:
    """Compile every block of `model.layers` in place (AC wrappers, if any, are compiled with their block)."""
    for block in model.layers.values():
        block.compile()
    logger.info("torch.compile: %d transformer blocks compiled (one graph, reused)", len(model.layers))
    return model


def loss_parallel_on(cfg) -> bool:
    """Whether the logits reach the loss sharded over the vocabulary (TP with parallelism.enable_loss_parallel)."""
    p = cfg.parallelism
    return p.tensor_parallel_degree > 1 and p.enable_loss_parallel


def compiles_loss(cfg, device_type: str) -> bool:
    """Whether the loss is compiled: compile.enable with "loss" in compile.components, except under loss parallel on
    a CPU, where the compiled cross-entropy over the vocabulary-sharded DTensor logits gives a wrong loss (torch
    2.13, gloo, the debug model on TP 2: 13.17 at step 1 where eager TP and one process give 8.17; without loss
    parallel the compiled loss agrees; found in session 30). Not seen on a GPU, where torchtitan compiles this loss
    (docs/performance.md, GPU command j, checks it). The trainer and the estimator both ask this."""
    c = cfg.compile
    return c.enable and "loss" in c.components and not (device_type == "cpu" and loss_parallel_on(cfg))


def maybe_compile_loss(loss_fn: Callable, cfg, device_type: str) -> Callable:
    """The loss function, compiled when compiles_loss(cfg, device_type) says so.

    The loss upcasts [batch, seq, vocab] logits to fp32 before log-softmax; compiled, Inductor can fuse the
    upcast, the log-softmax and the gather of the target logits instead of running separate passes over them.
    """
    c = cfg.compile
    if compiles_loss(cfg, device_type):
        logger.info("torch.compile: loss function compiled")
        return torch.compile(loss_fn)
    if c.enable and "loss" in c.components:
        logger.info(
            "torch.compile: loss function left eager under loss parallel on a CPU (compiled, its value is wrong)"
        )
    return loss_fn
