"""Llama 3 hyper-parameters, the published flavors, and the parameter/FLOP counts derived from them.

The counts are analytic (computed from the shapes, not by building a model), so the metrics logger and the
offline estimator can ask about a 405B model without allocating anything. tests/test_model.py checks them
against the totals Meta published and against a model built on the meta device.
"""

import dataclasses
from dataclasses import dataclass

from torchtitan.errors import UserError


@dataclass
class RopeScaling:
    """Llama 3.1 RoPE frequency scaling ("llama3" rope_type in Hugging Face configs).

    Wavelengths shorter than original_max_position_embeddings / high_freq_factor are kept, wavelengths longer
    than original_max_position_embeddings / low_freq_factor are stretched by `factor`, and the band between is
    interpolated smoothly. See `precompute_freqs_cis` in model.py for the formula.
    """

    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass
class ModelArgs:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    multiple_of: int = 256  # the FFN hidden size is rounded up to a multiple of this
    ffn_dim_multiplier: float | None = None
    ffn_dim: int | None = None  # exact FFN hidden size (Llama 2 7B: 11008); None = Meta's rule below
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    rope_scaling: RopeScaling | None = None
    max_seq_len: int = 8192  # length of the precomputed RoPE table; training seq_len must not exceed it
    tie_embeddings: bool = False  # output projection reuses tok_embeddings.weight (Llama 3.2 1B/3B)
    depth_init: bool = True  # scale output-projection init by layer depth (see Transformer.init_weights)

    def __post_init__(self):
        if isinstance(self.rope_scaling, dict):  # convenient for overrides coming from TOML
            self.rope_scaling = RopeScaling(**self.rope_scaling)
        for name in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "multiple_of", "max_seq_len"):
            if getattr(self, name) <= 0:
                raise UserError(f"model.{name}={getattr(self, name)} must be a positive integer")
        if self.ffn_dim is not None and self.ffn_dim <= 0:
            raise UserError(f"model.ffn_hidden_dim={self.ffn_dim} must be a positive integer")
        if self.ffn_dim_multiplier is not None and self.ffn_dim_multiplier <= 0:
            raise UserError(f"model.ffn_dim_multiplier={self.ffn_dim_multiplier} must be > 0")
        if not self.norm_eps > 0 or not self.rope_theta > 0:
            raise UserError(f"model norm_eps={self.norm_eps} and rope_theta={self.rope_theta} must be > 0")
        if self.dim % self.n_heads:
            raise UserError(f"model dim={self.dim} must be divisible by n_heads={self.n_heads}")
        if self.head_dim % 2:
            raise UserError(f"model head_dim={self.head_dim} (dim/n_heads) must be even for RoPE")
        if self.n_heads % self.n_kv_heads:
            raise UserError(f"model n_heads={self.n_heads} must be divisible by n_kv_heads={self.n_kv_heads}")

    def largest_weight_bytes(self) -> int:
        """fp32 bytes of the largest weight matrix (embedding/output or an FFN projection)."""
        return 4 * self.dim * max(self.vocab_size, self.ffn_hidden_dim)

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def ffn_hidden_dim(self) -> int:
        if self.ffn_dim is not None:
            return self.ffn_dim
        # Meta's rule: start from 4*dim, take 2/3 of it (SwiGLU has three matrices instead of two, so this keeps
        # the parameter count of a 4*dim two-matrix MLP), apply the optional multiplier, round up.
        hidden = int(2 * (4 * self.dim) / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)

    def _layer_params(self) -> int:
        d, hd = self.dim, self.head_dim
        attention = d * self.n_heads * hd + 2 * d * self.n_kv_heads * hd + self.n_heads * hd * d
        ffn = 3 * d * self.ffn_hidden_dim
        norms = 2 * d
        return attention + ffn + norms

    def num_embedding_params(self) -> int:
        """Parameters of the token embedding table (vocab_size * dim)."""
        return self.vocab_size * self.dim

    def num_params(self) -> int:
        """Total trainable parameters. A tied output projection shares the embedding table: counted once."""
        output = 0 if self.tie_embeddings else self.vocab_size * self.dim
        return self.num_embedding_params() + self.n_layers * self._layer_params() + self.dim + output

    def num_flop_params(self) -> int:
        """Parameters that multiply every token: num_params() - embedding table (+ vocab*dim when tied).

        The embedding lookup is a gather, not a matmul, so its table is excluded. The output projection is a
        matmul whether or not its weight is tied to the embedding, so it is always counted. RMSNorm weights
        (2*dim per layer + dim) stay in, as in the usual 6*N convention; they are < 0.01% of N.
        """
        tied_output = self.vocab_size * self.dim if self.tie_embeddings else 0
        return self.num_params() - self.num_embedding_params() + tied_output

    def flops_per_token(self, seq_len: int, causal: bool = False) -> int:
        """Training FLOPs per token (forward + backward) for sequences of length seq_len.

            6 * num_flop_params() + 12 * n_layers * n_heads * head_dim * seq_len

        6*N: each weight does one multiply-add (2 FLOPs) per token forward and two backward (input and weight
        gradients). Attention: per layer and token, q@k^T and probs@v each cost 2*seq_len*n_heads*head_dim
        FLOPs forward, so 4*L*H*hd*S forward and 12*L*H*hd*S with backward. This counts the full S x S score
        matrix (the convention of torchtitan and Megatron's older formula), although causal attention only
        needs the lower triangle; causal=True counts the triangle instead, halving the attention term.
        Softmax, norms, RoPE and the loss are ignored. docs/metrics.md cites this definition.
        """
        attention = 12 * self.n_layers * self.n_heads * self.head_dim * seq_len
        if causal:
            attention //= 2
        return 6 * self.num_flop_params() + attention


# Published shapes: Llama 3.1 (8B/70B/405B) and Llama 3.2 (1B/3B) params.json from Meta.
_LLAMA3_VOCAB = 128256
llama3_flavors: dict[str, ModelArgs] = {
    "debugmodel": ModelArgs(
        dim=256, n_layers=6, n_heads=16, n_kv_heads=4, vocab_size=2048, multiple_of=256, max_seq_len=2048
    ),
    # ~5x the debug model's FLOPs per token, head_dim 64 like the published flavors: the second shape of the CPU
    # benchmarks (scripts/bench_peers.py), with the same debug tokenizer.
    "debugmodel_large": ModelArgs(
        dim=512, n_layers=8, n_heads=8, n_kv_heads=2, vocab_size=2048, multiple_of=256, max_seq_len=2048
    ),
    "1B": ModelArgs(
        dim=2048,
        n_layers=16,
        n_heads=32,
        n_kv_heads=8,
        vocab_size=_LLAMA3_VOCAB,
        multiple_of=256,
        ffn_dim_multiplier=1.5,
        rope_scaling=RopeScaling(factor=32.0),
        tie_embeddings=True,
    ),
    "3B": ModelArgs(
        dim=3072,
        n_layers=28,
        n_heads=24,
        n_kv_heads=8,
        vocab_size=_LLAMA3_VOCAB,
        multiple_of=256,
        ffn_dim_multiplier=1.0,
        rope_scaling=RopeScaling(factor=32.0),
        tie_embeddings=True,
    ),
    "8B": ModelArgs(
        dim=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=8,
        vocab_size=_LLAMA3_VOCAB,
        multiple_of=1024,
        ffn_dim_multiplier=1.3,
        rope_scaling=RopeScaling(factor=8.0),
    ),
    "70B": ModelArgs(
        dim=8192,
        n_layers=80,
        n_heads=64,
        n_kv_heads=8,
        vocab_size=_LLAMA3_VOCAB,
        multiple_of=4096,
        ffn_dim_multiplier=1.3,
        rope_scaling=RopeScaling(factor=8.0),
    ),
    "405B": ModelArgs(
        dim=16384,
        n_layers=126,
        n_heads=128,
        n_kv_heads=8,
        vocab_size=_LLAMA3_VOCAB,
        multiple_of=4096,
        ffn_dim_multiplier=1.2,
        rope_scaling=RopeScaling(factor=8.0),
    ),
}


def get_model_args(flavor: str, **overrides) -> ModelArgs:
    """A fresh copy of a flavor's ModelArgs with `overrides` applied (e.g. max_seq_len=4096)."""
    if flavor not in llama3_flavors:
        raise UserError(f"model.flavor={flavor!r} is not a llama3 flavor; valid: {', '.join(llama3_flavors)}")
    fields = {f.name for f in dataclasses.fields(ModelArgs)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise UserError(f"unknown llama3 model argument(s) {unknown}; valid: {', '.join(sorted(fields))}")
    base = llama3_flavors[flavor]
    # deep-copy the nested RopeScaling so callers can never mutate the shared flavor table
    scaling = dataclasses.replace(base.rope_scaling) if base.rope_scaling is not None else None
    return dataclasses.replace(base, **{"rope_scaling": scaling, **overrides})
