"""Llama 3 in plain PyTorch, with Meta's module names (wq/wk/wv/wo, w1/w2/w3, attention_norm, ffn_norm).

The model knows nothing about parallelism (it never imports torch.distributed); torchtitan/parallel applies
FSDP/TP/PP/AC/compile to an already-built model. Construction follows build-on-meta -> parallelize ->
materialize -> initialize:

    with torch.device("meta"):
        model = Transformer(args)
    ...parallelize...
    model.to_empty(device="cuda")
    model.init_weights(seed)              # local_coords: which elements this process holds (default: all)

Things the parallel code may rely on:
  * `layers` is an nn.ModuleDict keyed "0".."n-1", so a pipeline stage can delete layers and keep FQNs.
  * `tok_embeddings`, `norm` and `output` may be set to None: without an embedding the input is taken as hidden
    states; without `norm` the stage returns hidden states; without `output` (and untied) it returns normed
    hidden states.
  * Head counts are inferred from the projection widths (view(..., -1, head_dim)), so tensor parallelism can
    shard wq/wk/wv column-wise and the local tensors just carry fewer heads.
"""

import contextlib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from torchtitan.models.counter_init import fill_normal, full_coords
from torchtitan.models.llama3.args import ModelArgs, RopeScaling

# --------------------------------------------------------------------------------------------------------- RoPE


def rope_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """The head_dim/2 rotation frequencies theta^(-2i/head_dim), with Llama 3.1 scaling when given (fp32, CPU).

    Llama 3.1 scaling (Meta's `apply_scaling`, llama-models/models/llama3/reference_impl/model.py; the
    "llama3" rope_type in Hugging Face transformers), with wavelength = 2*pi/freq and L = original max positions:
      wavelength < L / high_freq_factor  -> freq unchanged            (high frequencies: local position info)
      wavelength > L / low_freq_factor   -> freq / factor             (low frequencies: stretched for long context)
      otherwise, with s = (L / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor) in [0, 1]:
                                         -> (1 - s) * freq / factor + s * freq
    """
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device="cpu", dtype=torch.float32) / head_dim))
    if scaling is None:
        return freqs
    orig = scaling.original_max_position_embeddings
    low_wavelen = orig / scaling.low_freq_factor
    high_wavelen = orig / scaling.high_freq_factor
    wavelen = 2 * math.pi / freqs
    smooth = (orig / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    interpolated = (1 - smooth) * freqs / scaling.factor + smooth * freqs
    scaled = torch.where(wavelen > low_wavelen, freqs / scaling.factor, interpolated)
    return torch.where(wavelen < high_wavelen, freqs, scaled)


def precompute_freqs_cis(args: ModelArgs) -> torch.Tensor:
    """cos/sin of position * frequency, shape [max_seq_len, head_dim/2, 2], fp32.

    Meta stores these as complex numbers e^(i*angle) ("cis"); we keep the same numbers as (real, imag) pairs in
    a real tensor, because Module.to(torch.bfloat16) would silently drop the imaginary part of a complex buffer
    and torch.compile handles real arithmetic better. The rotation is the same complex multiply, written out.
    Built on CPU and moved to the current default device (meta while building on meta).
    """
    freqs = rope_frequencies(args.head_dim, args.rope_theta, args.rope_scaling)
    angles = torch.outer(torch.arange(args.max_seq_len, device="cpu", dtype=torch.float32), freqs)
    table = torch.stack((angles.cos(), angles.sin()), dim=-1)
    return table.to(torch.get_default_device())  # honours an enclosing `with torch.device(...)`


def apply_rotary_emb(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs (x[2i], x[2i+1]) of x [B, S, H, head_dim] by the angles in freqs_cis [S, hd/2, 2]
    (or [B, S, hd/2, 2]: a row per token, when the rows of a batch sit at different positions).

    This is Meta's form: view the pairs as complex numbers and multiply by e^(i*angle). (Hugging Face's
    rotate_half form pairs x[i] with x[i + hd/2] instead; checkpoint conversion permutes wq/wk rows.)
    Computed in fp32, returned in x's dtype. One complex multiply is one kernel each way (forward and backward),
    where the same arithmetic spelled out on the real and imaginary halves takes six plus a stack: 5x faster on
    CPU for the debug model's q and k (docs/performance.md), with bitwise the same fp32 result.
    """
    if torch.compiler.is_compiling():
        return _apply_rotary_emb_real(x, freqs_cis)
    pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))
    # [S, 1, hd/2] (training) or [B, S, 1, hd/2] (generation, per-row positions): broadcast over the heads
    rotation = torch.view_as_complex(freqs_cis.float()).unsqueeze(-2)
    return torch.view_as_real(pairs * rotation).flatten(-2).type_as(x)


def _apply_rotary_emb_real(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """The same rotation as apply_rotary_emb, (a + ib)(c + is) = (ac - bs) + i(as + bc), on real tensors.

    Used under torch.compile: Inductor generates no code for complex operators (it runs them as separate eager
    kernels: "Torchinductor does not support code generation for complex operators"), while this form fuses
    into one kernel with the casts around it. Eager keeps the complex kernel, which is faster there.
    """
    a, b = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = freqs_cis.float().unsqueeze(-3).unbind(-1)  # [S, 1, hd/2] or [B, S, 1, hd/2], as above
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2).type_as(x)


# ------------------------------------------------------------------------------------------------- KV cache
# Generation only (torchtitan/generate): training never creates a cache and takes none of these branches.


class KVCache(nn.Module):
    """Keys and values of every position so far, [B, kv_heads, max_len, head_dim] each, for generation.

    Allocated at the first update from the keys themselves, so under tensor parallelism it holds the local heads.
    Buffers (not plain attributes) so torch.compile treats them as fixed-address state of the model.
    """

    def __init__(self, max_len: int):
        super().__init__()
        self.max_len = max_len
        self.register_buffer("k", None, persistent=False)
        self.register_buffer("v", None, persistent=False)

    def update(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_len: int):
        """Write k, v [B, S, kv_heads, hd] into cache slots `slots` [S]; return the first kv_len slots of both."""
        if self.k is None:
            b, _, heads, hd = k.shape
            self.k = k.new_zeros(b, heads, self.max_len, hd)
            self.v = v.new_zeros(b, heads, self.max_len, hd)
        self.k.index_copy_(2, slots, k.transpose(1, 2))
        self.v.index_copy_(2, slots, v.transpose(1, 2))
        return self.k[:, :, :kv_len], self.v[:, :, :kv_len]


@dataclass
class CacheStep:
    """How one forward over a chunk of S tokens per row uses the KV caches (see Transformer.setup_kv_cache).

    positions: [B, S] RoPE position of each token; rows of a left-padded batch start at different positions.
    slots:     [S] cache slots the chunk's keys and values are written to (the same for every row).
    mask:      [B, 1, S, kv_len] bool, True where a query may attend to a cache slot; kv_len (its last size) is
               how many slots attention reads, so unused slots cost nothing, or all of them (fixed shapes).
    """

    positions: torch.Tensor
    slots: torch.Tensor
    mask: torch.Tensor


# ------------------------------------------------------------------------------------------------------- blocks


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[B, S, kv_heads, hd] -> [B, S, kv_heads * n_rep, hd]; query head h reads kv head h // n_rep (Meta's order)."""
    if n_rep == 1:
        return x
    b, s, kv, hd = x.shape
    return x[:, :, :, None, :].expand(b, s, kv, n_rep, hd).reshape(b, s, kv * n_rep, hd)


class Attention(nn.Module):
    """Causal grouped-query attention: n_heads query heads share n_kv_heads key/value heads.

    `native_gqa` (default True): let SDPA read each kv head for its n_rep query heads itself (`enable_gqa=True`)
    instead of materialising repeat_kv's n_rep copies of K and V -- saved for backward, so n_rep times the K/V
    activation memory, plus the copies' time and the backward's sum over the copies. The parallel code turns it
    off where the selected SDPA kernel would not do that natively (torchtitan/parallel/attention.py).
    """

    native_gqa = True
    # The training path's attention kernel: None is F.scaled_dot_product_attention; the parallel code may set a
    # drop-in with its signature (torchtitan/parallel/cpu_bf16.py on CPUs without bf16 instructions).
    sdpa = None

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.head_dim = args.head_dim
        self.n_rep = args.n_heads // args.n_kv_heads
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)
        self.kv_cache: KVCache | None = None  # set by Transformer.setup_kv_cache for generation

    def forward(
        self, x: torch.Tensor, freqs_cis: torch.Tensor, cache_step: CacheStep | None = None
    ) -> torch.Tensor:
        bsz, seqlen, _ = x.shape
        # -1 heads: under tensor parallelism these are the local heads of this rank
        q = self.wq(x).view(bsz, seqlen, -1, self.head_dim)
        k = self.wk(x).view(bsz, seqlen, -1, self.head_dim)
        v = self.wv(x).view(bsz, seqlen, -1, self.head_dim)
        if cache_step is not None:
            return self._forward_cached(q, k, v, freqs_cis, cache_step)
        # The table covers max_seq_len positions; take this sequence's. (Sliced here, not in Transformer.forward,
        # because under sequence parallelism the stream between blocks holds only seqlen/tp positions while
        # attention sees them all.)
        freqs_cis = freqs_cis[:seqlen]
        q, k = apply_rotary_emb(q, freqs_cis), apply_rotary_emb(k, freqs_cis)
        gqa = self.n_rep > 1 and self.native_gqa
        if self.n_rep > 1 and not gqa:
            k, v = repeat_kv(k, self.n_rep), repeat_kv(v, self.n_rep)
        # F's function is looked up at each call, as context parallel needs
        sdpa = self.sdpa or F.scaled_dot_product_attention
        out = sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=gqa)
        return self.wo(out.transpose(1, 2).reshape(bsz, seqlen, -1))

    def _forward_cached(self, q, k, v, freqs_cis: torch.Tensor, step: CacheStep) -> torch.Tensor:
        """Generation: RoPE at each token's own position (freqs_cis [B, S, hd/2, 2]), keys and values appended
        to the cache, attention over the cached slots under step.mask."""
        bsz, seqlen = q.shape[:2]
        q, k = apply_rotary_emb(q, freqs_cis), apply_rotary_emb(k, freqs_cis)
        keys, values = self.kv_cache.update(step.slots, k, v, step.mask.shape[-1])
        if seqlen == 1:
            # Decoding, one query per row: the n_rep query heads that share a kv head (h // n_rep, Meta's
            # order) become n_rep queries of that kv head. Same numbers; torch's CPU attention kernel is 4-12x
            # faster in bf16 this way than with enable_gqa (docs/performance.md).
            out = F.scaled_dot_product_attention(
                q.view(bsz, keys.shape[1], -1, self.head_dim), keys, values, attn_mask=step.mask
            )
            return self.wo(out.reshape(bsz, 1, -1))
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys, values, attn_mask=step.mask, enable_gqa=True
        )
        return self.wo(out.transpose(1, 2).reshape(bsz, seqlen, -1))


class FeedForward(nn.Module):
    """SwiGLU MLP: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """Pre-norm residual block: x + attention(norm(x)), then h + feed_forward(norm(h))."""

    def __init__(self, layer_id: int, args: ModelArgs):
        super().__init__()
        self.layer_id = layer_id
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args.dim, args.ffn_hidden_dim)
        self.attention_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)

    def forward(
        self, x: torch.Tensor, freqs_cis: torch.Tensor, cache_step: CacheStep | None = None
    ) -> torch.Tensor:
        # cache_step by keyword: tensor parallelism's input hooks lay out the positional inputs only
        h = x + self.attention(self.attention_norm(x), freqs_cis, cache_step=cache_step)
        return h + self.feed_forward(self.ffn_norm(h))


# ---------------------------------------------------------------------------------------------------------- init

# Wrappers that insert a path component without changing what the parameter is: activation checkpointing,
# torch.compile (OptimizedModule) and FSDP1. Removing them keeps init values independent of wrapping.
_WRAPPER_INFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")
_LAYER_WEIGHT = re.compile(r"layers\.(\d+)\.(attention|feed_forward)\.(wq|wk|wv|wo|w1|w2|w3)\.weight")

# local_coords(param) -> (the tensor this process holds of `param`, per dimension the global indices it covers)
LocalCoords = Callable[[torch.Tensor], tuple[torch.Tensor, list[torch.Tensor]]]


def normalize_fqn(fqn: str) -> str:
    """The parameter's name with wrapper infixes removed, e.g. layers.0._checkpoint_wrapped_module.x -> layers.0.x."""
    for infix in _WRAPPER_INFIXES:
        fqn = fqn.replace(infix, "")
    return fqn


# -------------------------------------------------------------------------------------------------------- model


class _NoDefaultInit(torch.overrides.TorchFunctionMode):
    """torch.nn.init's initializers (which module constructors call) return their tensor untouched."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return kwargs["tensor"] if "tensor" in kwargs else args[0]
        return func(*args, **kwargs)


class Transformer(nn.Module):
    # The tied output projection's kernel: None is F.linear; the parallel code may set a drop-in (as Attention.sdpa)
    tied_linear = None

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        # Built on the meta device (the usual path), nn.Embedding's and nn.Linear's default initializers compute
        # nothing, yet torch runs their meta kernels through Python references whose first call imports
        # torch._dynamo (~1 s of start-up): they are skipped there; init_weights sets every weight.
        with _NoDefaultInit() if torch.get_default_device().type == "meta" else contextlib.nullcontext():
            self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
            self.layers = nn.ModuleDict({str(i): TransformerBlock(i, args) for i in range(args.n_layers)})
            self.norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
            # Tied embeddings: no `output` module at all; forward multiplies by tok_embeddings.weight. One parameter
            # under one name keeps state dicts, DCP and FSDP simple. With FSDP, keep tok_embeddings in the root's
            # parameter group (do not fully_shard it alone), so its weight is still unsharded at the output matmul.
            self.output = None if args.tie_embeddings else nn.Linear(args.dim, args.vocab_size, bias=False)
            # Not persistent: derived from args, so it is neither checkpointed nor loaded.
            self.register_buffer("freqs_cis", precompute_freqs_cis(args), persistent=False)

    def forward(self, tokens: torch.Tensor, cache_step: CacheStep | None = None) -> torch.Tensor:
        """tokens [B, S] int64 -> logits [B, S, vocab] in the compute dtype (the trainer upcasts for the loss).

        A pipeline stage without tok_embeddings takes hidden states [B, S, dim] instead of tokens, and one
        without norm returns hidden states.
        With `cache_step` (generation, after setup_kv_cache) attention reads and extends the KV caches, and only
        the last position's logits are computed: [B, 1, vocab], all that sampling needs.
        """
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        freqs_cis = self.freqs_cis
        if cache_step is not None:
            freqs_cis = freqs_cis[cache_step.positions]  # [B, S, hd/2, 2]: each token's own row
        elif h.shape[1] > freqs_cis.shape[0]:
            raise ValueError(f"sequence length {h.shape[1]} exceeds model max_seq_len={freqs_cis.shape[0]}")
        for layer in self.layers.values():
            h = layer(h, freqs_cis, cache_step)
        if cache_step is not None:
            h = h[:, -1:]
        if self.norm is None:
            return h
        h = self.norm(h)
        if self.output is not None:
            return self.output(h)
        if self.args.tie_embeddings:
            if self.tok_embeddings is None:
                raise RuntimeError("tied output projection needs tok_embeddings in the same module (stage)")
            return (self.tied_linear or F.linear)(h, self.tok_embeddings.weight)
        return h

    def setup_kv_cache(self, max_len: int | None) -> None:
        """Give every attention layer an empty KV cache of max_len slots (generation); None removes them."""
        for layer in self.layers.values():
            layer.attention.kv_cache = KVCache(max_len) if max_len else None

    # ---- initialization ------------------------------------------------------------------------------------

    def _init_rule(self, fqn: str) -> tuple[str, float, float]:
        """(distribution, std, cutoff in stds) for a normalized parameter name."""
        args = self.args
        # Tied (1B, 3B): the one matrix is also the output projection, so it takes the output's init; at std 1.0
        # the first logits would have std sqrt(dim) (loss ~1800 instead of ~ln(vocab) for 1B).
        if fqn == "output.weight" or (fqn == "tok_embeddings.weight" and args.tie_embeddings):
            return "trunc_normal", args.dim**-0.5, 3.0
        if fqn == "tok_embeddings.weight":
            return "normal", 1.0, math.inf
        if fqn == "norm.weight" or fqn.endswith(("attention_norm.weight", "ffn_norm.weight")):
            return "ones", 0.0, 0.0
        m = _LAYER_WEIGHT.fullmatch(fqn)
        if m is None:
            raise RuntimeError(f"init_weights: no init rule for parameter {fqn!r}")
        if m.group(3) in ("wq", "wk", "wv", "w1"):
            return "trunc_normal", 0.02, 2.0
        # Projections writing into the residual stream: smaller, so the residual variance grows slowly.
        depth = int(m.group(1)) + 1 if args.depth_init else args.n_layers
        return "trunc_normal", 0.02 / math.sqrt(2 * depth), 2.0

    @torch.no_grad()
    def init_weights(self, seed: int = 0, local_coords: LocalCoords | None = None) -> None:
        """Initialize every parameter (and the RoPE buffer) independently of the parallel layout.

        Every element's value is a pure function of (seed, normalized parameter name, the element's coordinates in
        the full parameter): a counter-based generator (torchtitan/models/counter_init.py), so a process
        computes only the elements it holds, on the device they live on, and for one seed the full weights are
        identical whatever the sharding, wrapping, or which layers a pipeline stage kept.
        `local_coords(param)` says which elements those are (default: all; torchtitan.parallel.local_coords
        reads a DTensor's placements). The name is the parameter's FQN with wrapper infixes removed.

        Scheme (std; trunc_normal cuts at +-cutoff*std):
          tok_embeddings            normal, std 1.0 (tied to the output: the output's rule below)
          wq, wk, wv, w1            trunc_normal, std 0.02, cutoff 2
          wo, w2, w3 (layer i)      trunc_normal, std 0.02/sqrt(2*(i+1)) if depth_init else 0.02/sqrt(2*n_layers),
                                    cutoff 2
          output                    trunc_normal, std dim**-0.5, cutoff 3
          RMSNorm weights           ones
        """
        local_coords = local_coords or full_coords
        for fqn, param in self.named_parameters():  # modules set to None are simply absent
            fqn = normalize_fqn(fqn)
            kind, std, cutoff = self._init_rule(fqn)
            local, coords = local_coords(param)
            if kind == "ones":
                local.fill_(1.0)
            else:
                fill_normal(local, coords, seed, fqn, std, cutoff)
        self.init_buffers()

    @torch.no_grad()
    def init_buffers(self, device: torch.device | str | None = None) -> None:
        """Compute the RoPE table (not persistent: neither initialized randomly nor loaded) on `device` (default:
        where the buffer is). to_empty() leaves it uninitialized, so a run that loads a checkpoint calls this too.
        """
        device = self.freqs_cis.device if device is None else device
        self.freqs_cis = precompute_freqs_cis(self.args).to(device)
