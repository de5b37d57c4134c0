#!/usr/bin/env python
"""What one compiled transformer block saves for backward, tensor by tensor (CPU): the estimator's compiled
activation rules (torchtitan/estimate/activations.py, `saved_per_token` with compiled=True) are checked against it.

    python scripts/compiled_saved.py --ac none     # no activation checkpointing
    python scripts/compiled_saved.py --ac op       # selective per-op AC (this trainer's save list)
    python scripts/compiled_saved.py --ac full
    python scripts/compiled_saved.py --ac none --float8                    # every linear in float8 (tensorwise)
    python scripts/compiled_saved.py --ac none --float8 --float8-skip wk,wv   # wk and wv left in high precision

The block (the debug model's shape unless --dim/--ffn/--heads/--kv-heads say otherwise) is wrapped as the trainer
wraps it (torchtitan/parallel/activation_checkpoint.py) and compiled in place as the trainer compiles it
(torchtitan/parallel/compile.py); its forward runs under torch.autograd.graph.saved_tensors_hooks, which see the
tensors the compiled graph's autograd function saves (Inductor's partitioner chose them). Parameters, the RoPE
table and the block input are left out of the sum; the input is counted by the estimator as the block's stream.
`--float8` converts the block's linears with torchao's tensorwise recipe (the trainer's default; `--float8-recipe
rowwise` the other;
torchao's CPU float8 matmul stands in for CUDA's: what is saved is the partitioner's choice on the graph, not the
kernel's); `--float8-skip` names linears left in high precision, as the trainer's `float8.min_dim` filter leaves a
1B's 512-wide wk and wv.
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
    float8: bool = False,
    float8_skip: tuple[str, ...] = (),
    float8_recipe: str = "tensorwise",
) -> tuple[float, list[tuple[tuple, int]]]:
    """(fp32 elements saved per token beyond the block input and parameters, [(shape, bytes)] largest first;
    a float8 tensor counts its bytes, a quarter of an fp32 element each)."""
    torch.manual_seed(0)
    args = get_model_args(
        "debugmodel", dim=dim, n_heads=heads, n_kv_heads=kv_heads, ffn_dim=ffn, max_seq_len=seq
    )
    block = TransformerBlock(0, args)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.02)
    if float8:
        import torchao.float8 as ao

        ao.convert_to_float8_training(
            block,
            config=ao.Float8LinearConfig.from_recipe_name(float8_recipe),
            module_filter_fn=lambda mod, fqn: fqn.rsplit(".", 1)[-1] not in float8_skip,
        )
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
    ap.add_argument(
        "--float8", action="store_true", help="convert the linears to torchao float8 (tensorwise)"
    )
    ap.add_argument("--float8-skip", default="", help="linears left in high precision, e.g. wk,wv")
    ap.add_argument("--float8-recipe", default="tensorwise", choices=("tensorwise", "rowwise"))
    a = ap.parse_args()
    skip = tuple(x for x in a.float8_skip.split(",") if x)
    per_token, tensors = saved_by_compiled_block(
        a.ac,
        a.dim,
        a.ffn,
        a.heads,
        a.kv_heads,
        float8=a.float8,
        float8_skip=skip,
        float8_recipe=a.float8_recipe,
    )
    for shape, n in tensors:
        print(f"  {str(shape):24s} {n:>10,d} bytes")
    f8 = f" float8 (skip {a.float8_skip or 'none'})" if a.float8 else ""
    print(f"ac={a.ac}{f8} dim={a.dim} ffn={a.ffn} heads={a.heads} kv_heads={a.kv_heads}: {per_token:.1f} fp32 elements "
          "saved per token beyond the block input")  # fmt: skip


if __name__ == "__main__":
    main()
