#!/usr/bin/env python
"""Are the loss buffers (the logits, the loss's saved tensors, the logits' gradients) still alive when the last
transformer block's backward starts? (CPU; docs/estimate_log.md, "The compiled loss and the logits".)

    python scripts/loss_buffers_lifetime.py                       # eager blocks, eager loss, full AC
    python scripts/loss_buffers_lifetime.py --compile             # compiled blocks and compiled loss, full AC

The debug model (its shape, a larger vocabulary so the logits dominate) runs one micro-batch through the
trainer's own `forward_backward` (torchtitan/loss.py: `del logits`, then `loss.backward()`), under autocast bf16 as
one-rank runs use it (torchtitan/parallel/mixed_precision.py), with full activation checkpointing as the trainer
wraps it and, with --compile, the blocks and the loss compiled as the trainer compiles them. Weak references
follow every tensor of the loss region: the model's logits, every tensor the loss saves for backward
(saved_tensors_hooks: the compiled loss's saved set too) and every gradient its backward nodes produce, down to
the logits' gradient. They are read (1) when the gradient of the last block's output arrives (a hook on the final
norm's input: after it, autograd runs that block's backward, its recomputed forward first) and (2) for eager
blocks also when the checkpointed block's forward is re-entered for that recomputation.
"""

from __future__ import annotations

import argparse
import sys
import weakref
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from torchtitan.loss import cross_entropy_loss, forward_backward  # noqa: E402
from torchtitan.models.llama3 import get_model_args  # noqa: E402
from torchtitan.models.llama3.model import Transformer  # noqa: E402
from torchtitan.parallel.activation_checkpoint import apply_ac  # noqa: E402
from torchtitan.parallel.compile import apply_compile  # noqa: E402
from torchtitan.parallel.mixed_precision import apply_autocast  # noqa: E402


def measure(compile_: bool, vocab: int = 32768, batch: int = 2, seq: int = 128) -> dict[str, list[tuple]]:
    """{moment: [(what, shape, dtype, alive)]} for the loss region's tensors at each moment."""
    torch.manual_seed(0)
    args = get_model_args("debugmodel", vocab_size=vocab, max_seq_len=seq)
    model = Transformer(args)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    apply_ac(model, "full")
    apply_autocast(model, "cpu", "bfloat16")  # one-rank runs: autocast around the forward only
    if compile_:
        apply_compile(model)
    loss_fn = torch.compile(cross_entropy_loss) if compile_ else cross_entropy_loss
    tracked: list[tuple[str, weakref.ref, tuple, torch.dtype]] = []

    def track(what: str, t: torch.Tensor) -> None:
        if isinstance(t, torch.Tensor) and t.numel() >= vocab:  # [tokens, vocab]-sized buffers only
            tracked.append((what, weakref.ref(t), tuple(t.shape), t.dtype))

    def grad_hook(name):
        def hook(grad_inputs, grad_outputs):
            for g in grad_inputs:
                track(f"gradient out of {name}", g)

        return hook

    def tracking_loss(logits, labels, global_tokens):
        track("logits (model output)", logits)

        def logits_grad_hook(g):
            track("logits' gradient", g)
            snapshot("control: the logits' gradient arrives")

        logits.register_hook(logits_grad_hook)
        with torch.autograd.graph.saved_tensors_hooks(
            lambda t: (track("saved by the loss", t), t)[1], lambda t: t
        ):
            loss = loss_fn(logits, labels, global_tokens)
        # every backward node between the loss and the logits (the head's node excluded)
        stop, stack, seen = logits.grad_fn, [loss.grad_fn], set()
        while stack:
            node = stack.pop()
            if node is None or node is stop or node in seen:
                continue
            seen.add(node)
            node.register_hook(grad_hook(node.name()))
            stack.extend(n for n, _ in node.next_functions)
        return loss

    moments: dict[str, list[tuple]] = {}

    def snapshot(moment: str) -> None:
        if moment not in moments:
            moments[moment] = [(w, s, d, r() is not None) for w, r, s, d in tracked]

    in_backward = [False]

    def norm_input_hook(module, inputs):
        h = inputs[0]
        if h.requires_grad:
            h.register_hook(lambda g: snapshot("gradient of the last block's output arrives"))

    model.norm.register_forward_pre_hook(norm_input_hook)
    last = list(model.layers.values())[-1]
    inner = getattr(last, "_checkpoint_wrapped_module", None)
    if inner is not None and not compile_:
        inner.register_forward_pre_hook(
            lambda m, a: (
                snapshot("last block's forward re-entered (recomputation)") if in_backward[0] else None
            )
        )

    def loss_then_mark(logits, labels, global_tokens):
        loss = tracking_loss(logits, labels, global_tokens)
        in_backward[0] = True
        return loss

    tokens = torch.randint(0, vocab, (batch, seq))
    labels = torch.randint(0, vocab, (batch, seq))
    forward_backward([model], tokens, labels, batch * seq, loss_fn=loss_then_mark)
    return moments


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compile", action="store_true", help="compiled blocks and compiled loss")
    a = ap.parse_args()
    moments = measure(a.compile)
    print(f"{'compiled' if a.compile else 'eager'} blocks and loss, full AC, autocast bf16")
    for moment, rows in moments.items():
        alive = [r for r in rows if r[3]]
        print(f"at '{moment}': {len(alive)} of {len(rows)} loss-region [tokens, vocab] tensors alive")
        for what, shape, dtype, live in rows:
            print(f"    {'ALIVE' if live else 'freed'}  {what:40s} {str(list(shape)):18s} {dtype}")


if __name__ == "__main__":
    main()
