#!/usr/bin/env python
"""What one compiled transformer block saves for backward, tensor by tensor (CPU): the estimator's compiled
activation rules (torchtitan/estimate/activations.py, `saved_per_token` with compiled=True) are checked against it.

    python scripts/compiled_saved.py --ac none     # no activation checkpointing
    python scripts/compiled_saved.py --ac op       # selective per-op AC (this trainer's save list)
    python scripts/compiled_saved.py --ac full

The block (the debug model's shape unless --dim/--ffn/--heads/--kv-heads say otherwise) is wrapped as the trainer
wraps it (torchtitan/parallel/activation_checkpoint.py) and compiled in place as the trainer compiles it
(torchtitan/parallel/compile.py); its forward runs under torch.autograd.graph.saved_tensors_hooks, which see the
tensors the compiled graph's autograd function saves (Inductor's partitioner chose them). Parameters, the RoPE
table and the block input are left out of the sum; the input is counted by the estimator as the block's stream.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from torchtitan.models.llama3 import get_model_args  # noqa: E402
from torchtitan.models.llama3.model import TransformerBlock, precompute_freqs_cis  # noqa: E402
from torchtitan.parallel.activation_checkpoint import _wrap  # noqa: E402


def saved_by_compiled_block(
    ac: str,
    dim: int = 256,
    ffn: int = 768,
    heads: int = 16,
    kv_heads: int = 4,
    batch: int = 2,
    seq: int = 128,
) -> tuple[float, list[tuple[tuple, int]]]:
    """(fp32 elements saved per token beyond the block input and parameters, [(shape, bytes)] largest first)."""
    torch.manual_seed(0)
    args = get_model_args(
        "debugmodel", dim=dim, n_heads=heads, n_kv_heads=kv_heads, ffn_dim=ffn, max_seq_len=seq
    )
    block = TransformerBlock(0, args)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.02)
    if ac != "none":
        block = _wrap(block, per_op=(ac == "op"))
    block.compile()
    freqs = precompute_freqs_cis(args)
    x = torch.randn(batch, seq, dim, requires_grad=True)
    skip = {p.untyped_storage().data_ptr() for p in block.parameters()}
    skip |= {freqs.untyped_storage().data_ptr(), x.untyped_storage().data_ptr()}
    seen: dict[int, tuple[tuple, int]] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in skip:
            seen[ptr] = (tuple(t.shape), t.untyped_storage().nbytes())
        return t

    for _ in range(2):  # the first call compiles; count the second
        seen.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = block(x, freqs)
        y.sum().backward()
    tensors = sorted(seen.values(), key=lambda v: -v[1])
    return sum(n for _, n in tensors) / (batch * seq) / 4, tensors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ac", choices=("none", "op", "full"), default="none")
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=768)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    a = ap.parse_args()
    per_token, tensors = saved_by_compiled_block(a.ac, a.dim, a.ffn, a.heads, a.kv_heads)
    for shape, n in tensors:
        print(f"  {str(shape):24s} {n:>10,d} bytes")
    print(f"ac={a.ac} dim={a.dim} ffn={a.ffn} heads={a.heads} kv_heads={a.kv_heads}: {per_token:.1f} fp32 elements "
          "saved per token beyond the block input")  # fmt: skip


if __name__ == "__main__":
    main()
