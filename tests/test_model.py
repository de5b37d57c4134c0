"""Llama 3 model: shapes, parameter/FLOP counts, layout-independent init, attention, RoPE, and learning."""

import copy
import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import ROOT
from torchtitan.errors import UserError
from torchtitan.models import MODELS, build_model_args
from torchtitan.models.counter_init import _mix32_top_, as_int32, fill_normal, mix32
from torchtitan.models.llama3 import ModelArgs, RopeScaling, Transformer, get_model_args, llama3_flavors
from torchtitan.models.llama3.model import (
    _apply_rotary_emb_real,
    apply_rotary_emb,
    precompute_freqs_cis,
    rope_frequencies,
)

# Totals from Meta's model cards / safetensors metadata (Llama 3.2 1B/3B with tied embeddings, Llama 3.1).
PUBLISHED_PARAMS = {
    "1B": 1_235_814_400,
    "3B": 3_212_749_824,
    "8B": 8_030_261_248,
    "70B": 70_553_706_496,
    "405B": 405_853_388_800,
}


def tiny_args(**kw) -> ModelArgs:
    base = dict(dim=64, n_layers=4, n_heads=8, n_kv_heads=2, vocab_size=128, multiple_of=32, max_seq_len=64)
    return ModelArgs(**(base | kw))


def init_model(args: ModelArgs, seed: int = 0, meta: bool = True) -> Transformer:
    if meta:
        with torch.device("meta"):
            model = Transformer(args)
        model.to_empty(device="cpu")
    else:
        model = Transformer(args)
    model.init_weights(seed)
    return model


def test_initial_loss_is_near_uniform_with_and_without_tied_embeddings():
    """At init the model predicts roughly uniformly: loss ~ ln(vocab). A tied embedding is also the output
    projection, so it takes the output's init (std dim**-0.5); at the untied embedding's std 1.0 the logit of a
    token for itself would be ~dim (1B: first loss ~1800). Width of 1B (2048), where the blocks' outputs, not the
    embedding, dominate the residual stream at init, as they do in the real flavors."""
    for tie in (False, True):
        args = tiny_args(dim=2048, n_layers=1, n_heads=32, n_kv_heads=8, vocab_size=512, tie_embeddings=tie)
        model = init_model(args)
        tokens = torch.randint(0, args.vocab_size, (4, 33), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            logits = model(tokens[:, :-1]).float()
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        assert abs(loss.item() - math.log(args.vocab_size)) < 1.0, (tie, loss.item())


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ----------------------------------------------------------------------------------------- shapes and counts


@pytest.mark.parametrize("flavor", list(llama3_flavors))
def test_flavor_shapes_on_meta(flavor):
    args = llama3_flavors[flavor]
    with torch.device("meta"):
        model = Transformer(args)
    params = dict(model.named_parameters())
    hd, kv = args.head_dim, args.n_kv_heads
    assert params["tok_embeddings.weight"].shape == (args.vocab_size, args.dim)
    assert params["layers.0.attention.wq.weight"].shape == (args.dim, args.dim)
    assert params["layers.0.attention.wk.weight"].shape == (kv * hd, args.dim)
    assert params["layers.0.attention.wv.weight"].shape == (kv * hd, args.dim)
    assert params["layers.0.attention.wo.weight"].shape == (args.dim, args.dim)
    assert params["layers.0.feed_forward.w1.weight"].shape == (args.ffn_hidden_dim, args.dim)
    assert params["layers.0.feed_forward.w2.weight"].shape == (args.dim, args.ffn_hidden_dim)
    assert params["layers.0.feed_forward.w3.weight"].shape == (args.ffn_hidden_dim, args.dim)
    assert list(model.layers.keys()) == [str(i) for i in range(args.n_layers)]
    assert ("output.weight" in params) == (not args.tie_embeddings)
    assert model.freqs_cis.shape == (args.max_seq_len, hd // 2, 2)
    assert "freqs_cis" not in model.state_dict()  # non-persistent
    # the analytic count agrees with the built module (a tied weight is one Parameter, counted once)
    assert sum(p.numel() for p in model.parameters()) == args.num_params()
    logits = model(torch.zeros(1, 4, dtype=torch.long, device="meta"))
    assert logits.shape == (1, 4, args.vocab_size)


def test_ffn_hidden_dims():
    dims = {k: a.ffn_hidden_dim for k, a in llama3_flavors.items()}
    assert dims == {
        "debugmodel": 768,
        "debugmodel_large": 1536,
        "1B": 8192,
        "3B": 8192,
        "8B": 14336,
        "70B": 28672,
        "405B": 53248,
    }


@pytest.mark.parametrize("flavor", list(PUBLISHED_PARAMS))
def test_param_counts_match_published(flavor):
    n = llama3_flavors[flavor].num_params()
    assert abs(n - PUBLISHED_PARAMS[flavor]) / PUBLISHED_PARAMS[flavor] < 0.005
    assert n == PUBLISHED_PARAMS[flavor]  # in fact exact


def test_flops_per_token_debugmodel_by_hand():
    a = llama3_flavors["debugmodel"]  # dim 256, 6 layers, 16 heads (hd 16), 4 kv heads, ffn 768, vocab 2048
    attn = 256 * 256 + 2 * (256 * 4 * 16) + 256 * 256  # wq + wk + wv + wo = 163,840
    ffn = 3 * 256 * 768  # 589,824
    layer = attn + ffn + 2 * 256  # + two RMSNorm weights = 754,176
    n_flop = 6 * layer + 256 + 2048 * 256  # layers + final norm + output head = 5,049,600
    assert n_flop == 5_049_600
    assert a.num_embedding_params() == 2048 * 256
    assert a.num_params() == n_flop + 2048 * 256
    assert a.num_flop_params() == n_flop
    expected = 6 * 5_049_600 + 12 * 6 * 16 * 16 * 2048  # 30,297,600 + 37,748,736
    assert a.flops_per_token(2048) == expected == 68_046_336


def test_flops_per_token_8b_by_hand():
    a = llama3_flavors["8B"]  # dim 4096, 32 layers, 32 heads (hd 128), 8 kv heads, ffn 14336, vocab 128256
    layer = (4096 * 4096 * 2 + 2 * 4096 * 1024) + 3 * 4096 * 14336 + 2 * 4096  # 218,112,000
    n_flop = 32 * layer + 4096 + 128256 * 4096  # 7,504,924,672 (embedding table excluded)
    assert n_flop == 7_504_924_672
    assert a.num_flop_params() == n_flop
    expected = 6 * n_flop + 12 * 32 * 32 * 128 * 8192  # 45,029,548,032 + 12,884,901,888
    assert a.flops_per_token(8192) == expected == 57_914_449_920


def test_flops_causal_halves_attention_and_tied_output_counts():
    for a in llama3_flavors.values():
        full, causal = a.flops_per_token(4096), a.flops_per_token(4096, causal=True)
        attention = 12 * a.n_layers * a.n_heads * a.head_dim * 4096
        assert full - causal == attention // 2
        assert causal == 6 * a.num_flop_params() + attention // 2
    # tied: the output matmul still runs, so nothing is subtracted
    one_b = llama3_flavors["1B"]
    assert one_b.num_flop_params() == one_b.num_params()


def test_get_model_args_and_registry_errors():
    args = get_model_args("8B", max_seq_len=4096)
    assert args.max_seq_len == 4096 and llama3_flavors["8B"].max_seq_len == 8192  # a copy, table unchanged
    args.rope_scaling.factor = 99.0
    assert llama3_flavors["8B"].rope_scaling.factor == 8.0
    with pytest.raises(UserError, match=r"'9B'.*debugmodel, debugmodel_large, 1B, 3B, 8B, 70B, 405B"):
        get_model_args("9B")
    with pytest.raises(UserError, match="unknown llama3 model argument"):
        get_model_args("8B", hidden=3)
    assert build_model_args("llama3", "debugmodel") == llama3_flavors["debugmodel"]
    assert MODELS["llama3"] == (Transformer, llama3_flavors)
    with pytest.raises(UserError, match=r"'llama2'.*valid: llama3"):
        build_model_args("llama2", "8B")
    with pytest.raises(UserError, match="'tiny'"):
        build_model_args("llama3", "tiny")
    with pytest.raises(UserError, match="n_kv_heads"):
        ModelArgs(dim=64, n_layers=1, n_heads=8, n_kv_heads=3, vocab_size=10)


# -------------------------------------------------------------------------------------------------------- init


def test_init_deterministic_per_seed():
    args = tiny_args()
    a, b, c = state(init_model(args, 0)), state(init_model(args, 0)), state(init_model(args, 1))
    for k in a:
        assert torch.equal(a[k], b[k]), k
        if not k.endswith("norm.weight"):
            assert not torch.equal(a[k], c[k]), k
    # each parameter has its own stream: same-shaped parameters are not copies of each other
    assert not torch.equal(a["layers.0.attention.wq.weight"], a["layers.1.attention.wq.weight"])


def test_init_scheme_statistics():
    args = tiny_args(dim=256, n_heads=8, n_kv_heads=2, vocab_size=512, multiple_of=256)
    p = dict(init_model(args).named_parameters())
    trunc2 = 0.8796  # std of a normal truncated at +-2 std, relative to the untruncated std
    emb = p["tok_embeddings.weight"]
    assert abs(emb.std().item() - 1.0) < 0.02 and emb.abs().max() > 3.0  # not truncated
    for name in ("attention.wq", "attention.wk", "feed_forward.w1"):
        w = p[f"layers.0.{name}.weight"]
        assert abs(w.std().item() - 0.02 * trunc2) < 0.002 and w.abs().max() <= 0.04
    for layer in (0, 3):
        w = p[f"layers.{layer}.feed_forward.w2.weight"]
        std = 0.02 / math.sqrt(2 * (layer + 1))
        assert abs(w.std().item() - std * trunc2) < 0.1 * std and w.abs().max() <= 2 * std
    out = p["output.weight"]
    assert out.abs().max() <= 3 * 256**-0.5 and abs(out.std().item() - 256**-0.5) < 0.05 * 256**-0.5
    assert torch.equal(p["layers.2.ffn_norm.weight"], torch.ones(256)) and torch.equal(
        p["norm.weight"], torch.ones(256)
    )
    # depth_init=False: every layer uses 0.02/sqrt(2*n_layers)
    flat = dict(init_model(tiny_args(dim=256, multiple_of=256, depth_init=False)).named_parameters())
    std = 0.02 / math.sqrt(2 * 4)
    for layer in (0, 3):
        assert abs(flat[f"layers.{layer}.attention.wo.weight"].std().item() - std * trunc2) < 0.1 * std


def test_init_same_on_meta_and_cpu_and_freqs_restored():
    args = tiny_args(rope_scaling=RopeScaling(factor=8.0, original_max_position_embeddings=32))
    meta, cpu = init_model(args, 5, meta=True), init_model(args, 5, meta=False)
    for (k, v), (k2, v2) in zip(meta.state_dict().items(), cpu.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k
    assert torch.equal(meta.freqs_cis, precompute_freqs_cis(args))  # to_empty garbage was overwritten
    tokens = torch.randint(0, args.vocab_size, (2, 16))
    assert torch.equal(meta(tokens), cpu(tokens))


def test_meta_build_skips_the_default_initializers_and_their_dynamo_import():
    """On the meta device the constructors' initializers are skipped (torch's meta kernels for them import
    torch._dynamo, ~1 s of an estimate's or a generation's start-up); on a real device they run as always."""
    code = (
        "import sys, torch\n"
        "from torchtitan.models.llama3 import ModelArgs, Transformer\n"
        "args = ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=128, max_seq_len=16)\n"
        "with torch.device('meta'):\n"
        "    meta = Transformer(args)\n"
        "assert 'torch._dynamo' not in sys.modules, 'the meta build imported torch._dynamo'\n"
        "shapes = {k: (tuple(v.shape), v.dtype) for k, v in meta.state_dict().items()}\n"
        "cpu = Transformer(args)\n"
        "assert shapes == {k: (tuple(v.shape), v.dtype) for k, v in cpu.state_dict().items()}\n"
        "std = cpu.tok_embeddings.weight.std().item()\n"
        "assert 0.9 < std < 1.1, std  # nn.Embedding's own N(0, 1), not uninitialized memory\n"
        "bound = 1 / 64 ** 0.5\n"
        "w = cpu.output.weight\n"
        "assert w.abs().max().item() <= bound and w.std().item() > 0.5 * bound / 3 ** 0.5  # nn.Linear's U(+-1/sqrt(in))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


class FakeCheckpointWrapper(nn.Module):
    """Stands in for activation checkpointing's wrapper: it only adds a path component."""

    def __init__(self, inner):
        super().__init__()
        self._checkpoint_wrapped_module = inner

    def forward(self, *a):
        return self._checkpoint_wrapped_module(*a)


def test_init_independent_of_layers_present_and_wrappers():
    args = tiny_args()
    full = state(init_model(args, 3))
    with torch.device("meta"):
        stage = Transformer(args)
    # a later pipeline stage: first two layers and the embedding gone
    del stage.layers["0"], stage.layers["1"]
    stage.tok_embeddings = None
    # wrapped layers, as activation checkpointing and torch.compile leave them
    stage.layers["2"] = FakeCheckpointWrapper(stage.layers["2"])
    stage.layers["3"] = torch.compile(stage.layers["3"])  # not run, so nothing is compiled
    stage.to_empty(device="cpu")
    stage.init_weights(3)
    names = dict(stage.named_parameters())
    assert "layers.2._checkpoint_wrapped_module.attention.wq.weight" in names
    assert "layers.3._orig_mod.feed_forward.w2.weight" in names
    checked = 0
    for name, value in names.items():
        clean = name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")
        assert torch.equal(value, full[clean]), name
        checked += 1
    assert checked == len([k for k in full if k.startswith(("layers.2.", "layers.3.", "norm.", "output."))])


def init_shards(args: ModelArgs, seed: int, pick) -> dict[str, tuple[torch.Tensor, list[torch.Tensor]]]:
    """Initialize as a rank holding, of every parameter, only the elements `pick(shape)` -> per-dimension index
    lists names (as DTensor shards do); returns {name: (local values, index lists)}."""
    with torch.device("meta"):
        model = Transformer(args)
    model.to_empty(device="cpu")
    name_of = {id(p): name for name, p in model.named_parameters()}
    held = {}

    def local_coords(param):
        coords = pick(param.shape)
        local = torch.full([len(c) for c in coords], float("nan"))
        held[name_of[id(param)]] = (local, coords)
        return local, coords

    model.init_weights(seed, local_coords=local_coords)
    return held


@pytest.mark.parametrize(
    "how",
    ["rows", "columns", "strided rows x odd columns"],
)
def test_init_of_a_shard_equals_that_part_of_the_full_init(how):
    """A rank computes only the elements it holds: row chunks (FSDP/TP Shard(0)), column chunks (TP Shard(1)) and
    non-contiguous index sets (FSDP x TP's strided shard) all reproduce those elements of the unsharded init."""
    args = tiny_args(tie_embeddings=True)
    reference = state(init_model(args, 7))
    world = 3  # uneven: the chunks differ in size

    def pick_for(rank):
        def pick(shape):
            coords = [torch.arange(n) for n in shape]
            if how == "rows":
                coords[0] = coords[0].chunk(world)[rank]
            elif how == "columns" and len(shape) > 1:
                coords[1] = coords[1].chunk(world)[rank]
            elif how.startswith("strided"):
                coords[0] = coords[0][rank::world]
                if len(shape) > 1:
                    coords[1] = coords[1][1::2]
            return coords

        return pick

    for rank in range(world):
        held = init_shards(args, 7, pick_for(rank))
        assert set(held) == set(reference)  # freqs_cis is a non-persistent buffer, so not in either
        for name, (local, coords) in held.items():
            assert torch.equal(local, reference[name][torch.meshgrid(*coords, indexing="ij")]), (
                how,
                rank,
                name,
            )


def sample(shape, name="a.weight", std=1.0, cutoff=math.inf, seed=0) -> torch.Tensor:
    """Counter-based init of a whole tensor of `shape` (all coordinates), in float64 for the statistics."""
    value = torch.empty(shape)
    fill_normal(value, [torch.arange(n) for n in shape], seed, name, std, cutoff)
    return value.double()


def test_counter_normal_distribution():
    """The counter-based generator's values are the intended distributions: mean, std, bounds, the truncated
    normal's CDF (Kolmogorov-Smirnov), and no correlation between neighbours, rows, columns or parameters."""
    shape = (1024, 2048)
    n = math.prod(shape)
    trunc = sample(shape, std=0.5, cutoff=2.0)
    assert trunc.abs().max() <= 1.0 and trunc.abs().max() > 0.999  # cut at exactly 2 std, and reaching it
    assert abs(trunc.mean()) < 5 * 0.44 / n**0.5  # 5 standard errors of the mean (std / sqrt(n))
    assert abs(trunc.std() / 0.5 - 0.87962566) < 2e-3  # std of a normal truncated at +-2 std
    phi = lambda x: 0.5 * (1 + torch.erf(torch.as_tensor(x, dtype=torch.float64) / 2**0.5))  # noqa: E731
    cdf = (phi(trunc.flatten().sort().values / 0.5) - phi(-2.0)) / (phi(2.0) - phi(-2.0))
    ks = (cdf - torch.arange(1, n + 1, dtype=torch.float64) / n).abs().max()
    assert ks < 1.63 / n**0.5  # below the 1% critical value of the Kolmogorov-Smirnov statistic
    plain = sample(shape, name="b.weight")
    assert abs(plain.std() - 1.0) < 2e-3 and 4.5 < plain.abs().max() < 5.5  # tails end near 5.4 std
    other_seed = sample(shape, std=0.5, cutoff=2.0, seed=1)

    def corr(a, b):
        return torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1].abs().item()

    # neighbours along a row and along a column; two parameters and two seeds at the same positions
    pairs = [(trunc[:, :-1], trunc[:, 1:]), (trunc[:-1], trunc[1:]), (trunc, plain), (trunc, other_seed)]
    assert max(corr(a, b) for a, b in pairs) < 5 / (n / 2) ** 0.5
    # rows are not shifted copies of each other (the final hash round), nor columns
    assert max(corr(trunc[0], trunc[r]) for r in (1, 2, 513)) < 5 / shape[1] ** 0.5
    assert max(corr(trunc[:, 0], trunc[:, c]) for c in (1, 2, 1025)) < 5 / shape[0] ** 0.5


def test_counter_init_1d_and_bf16_and_non_contiguous():
    """Any rank works (1-D here), any dtype (computed in fp32, then rounded), any memory layout (a transposed view
    gets the values of its own coordinates)."""
    ref = sample((64, 48), std=0.02, cutoff=2.0)
    bf16 = torch.empty(64, 48, dtype=torch.bfloat16)
    fill_normal(bf16, [torch.arange(64), torch.arange(48)], 0, "a.weight", 0.02, 2.0)
    assert torch.equal(bf16, ref.to(torch.bfloat16))
    t = torch.empty(48, 64).t()  # non-contiguous [64, 48]
    fill_normal(t, [torch.arange(64), torch.arange(48)], 0, "a.weight", 0.02, 2.0)
    assert torch.equal(t.double(), ref)
    one_d = sample((1000,), name="v")
    assert abs(one_d.mean()) < 0.2 and 0.9 < one_d.std() < 1.1 and len(set(one_d.tolist())) == 1000


def lowbias32(x: int) -> int:
    """The published lowbias32 with plain multiplications (Python integers do not overflow)."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_mix32_is_lowbias32_without_int64_overflow():
    """The hash on int64 tensors (products kept below 2^63) equals lowbias32 computed with exact integers, and so
    does the per-element round on int32 bit patterns (wrapping products, masked arithmetic shifts)."""
    edges = [0, 1, 2, 12345, 2**15 - 1, 2**16, 2**31 - 1, 2**31, 2**31 + 1, 2**32 - 2, 2**32 - 1]
    x = torch.cat(
        [torch.tensor(edges), torch.randint(0, 2**32, (100_003,), generator=torch.Generator().manual_seed(0))]
    )
    assert mix32(x[:11]).tolist() == [lowbias32(int(v)) for v in x[:11]] == [mix32(int(v)) for v in x[:11]]
    assert mix32(x).max() < 2**32 and mix32(x).min() >= 0
    assert len(set(mix32(torch.arange(1 << 16)).tolist())) == 1 << 16  # a bijection: no collisions
    # the in-place int32 version used per element (an odd length: vector body and scalar tail) stops before the
    # final xorshift; its bit pattern read as unsigned is lowbias32's value before that step
    in_place = as_int32(x)
    _mix32_top_(in_place, torch.empty_like(in_place))
    unsigned = in_place.to(torch.int64) % 2**32
    assert torch.equal(unsigned ^ (unsigned >> 16), mix32(x))


# ------------------------------------------------------------------------------------------------------ forward


def test_forward_shape_finite_and_dtype():
    args = tiny_args()
    model = init_model(args)
    logits = model(torch.randint(0, args.vocab_size, (2, 32)))
    assert logits.shape == (2, 32, args.vocab_size) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    bf16 = init_model(args).to(torch.bfloat16)
    # the cos/sin table is real, so a dtype cast rounds it but keeps the sin half (a complex table would lose it)
    torch.testing.assert_close(bf16.freqs_cis.float(), precompute_freqs_cis(args), rtol=1e-2, atol=1e-2)
    out = bf16(torch.randint(0, args.vocab_size, (2, 32)))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    with pytest.raises(ValueError, match="max_seq_len=64"):
        model(torch.zeros(1, 65, dtype=torch.long))


def test_tied_embeddings_use_embedding_weight():
    args = tiny_args(tie_embeddings=True)
    model = init_model(args)
    assert model.output is None and "output.weight" not in model.state_dict()
    tokens = torch.randint(0, args.vocab_size, (2, 8))
    h = model.norm(_without_head(model)(tokens))
    torch.testing.assert_close(model(tokens), h @ model.tok_embeddings.weight.T)
    model(tokens).sum().backward()
    assert model.tok_embeddings.weight.grad is not None


def _without_head(model: Transformer) -> Transformer:
    m = copy.deepcopy(model)
    m.norm = None
    return m


def test_pipeline_style_split_matches_full_model():
    args = tiny_args()
    model = init_model(args)
    first, last = copy.deepcopy(model), copy.deepcopy(model)
    del first.layers["2"], first.layers["3"]
    first.norm = first.output = None
    del last.layers["0"], last.layers["1"]
    last.tok_embeddings = None
    tokens = torch.randint(0, args.vocab_size, (2, 16))
    hidden = first(tokens)
    assert hidden.shape == (2, 16, args.dim)
    torch.testing.assert_close(last(hidden), model(tokens), rtol=0, atol=0)


def reference_attention(attn, x, args: ModelArgs, interleaved_groups: bool = False) -> torch.Tensor:
    """Naive GQA with Meta's complex-number RoPE and an explicit causal softmax, head by head."""
    b, s, _ = x.shape
    hd, n_rep = args.head_dim, args.n_heads // args.n_kv_heads
    freqs = rope_frequencies(hd, args.rope_theta, args.rope_scaling)
    cis = torch.polar(torch.ones(s, hd // 2), torch.outer(torch.arange(s, dtype=torch.float32), freqs))

    def rope(t):  # t [b, s, heads, hd]
        z = torch.view_as_complex(t.float().reshape(*t.shape[:-1], -1, 2))
        return torch.view_as_real(z * cis[None, :, None, :]).flatten(-2)

    q = rope((x @ attn.wq.weight.T).view(b, s, args.n_heads, hd))
    k = rope((x @ attn.wk.weight.T).view(b, s, args.n_kv_heads, hd))
    v = (x @ attn.wv.weight.T).view(b, s, args.n_kv_heads, hd)
    mask = torch.ones(s, s).tril().bool()
    heads = []
    for h in range(args.n_heads):
        # Meta: consecutive query heads share a kv head; the other grouping exists only to show the test can fail
        kv = h % args.n_kv_heads if interleaved_groups else h // n_rep
        scores = q[:, :, h] @ k[:, :, kv].transpose(-1, -2) / math.sqrt(hd)
        probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        heads.append(probs @ v[:, :, kv])
    return torch.cat(heads, dim=-1) @ attn.wo.weight.T


def test_gqa_attention_matches_naive_reference():
    args = tiny_args(dim=32, n_heads=4, n_kv_heads=2, max_seq_len=16)
    model = init_model(args)
    attn = model.layers["0"].attention
    with torch.no_grad():  # larger q/k weights so attention is far from uniform
        attn.wq.weight.mul_(20)
        attn.wk.weight.mul_(20)
    x = torch.randn(2, 10, args.dim)
    out = attn(x, model.freqs_cis[:10])
    ref = reference_attention(attn, x, args)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(out, reference_attention(attn, x, args, interleaved_groups=True), atol=1e-3)
    # causal: the first position's output depends on nothing after it
    torch.testing.assert_close(attn(x[:, :1], model.freqs_cis[:1]), out[:, :1], rtol=1e-4, atol=1e-6)


def test_native_gqa_equals_repeat_kv_without_copies():
    """SDPA's native GQA (the default) and the repeat_kv fallback compute the same attention and gradients; the
    native path hands the kernel the n_kv_heads K/V heads, not n_rep copies."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class KeyHeads(TorchDispatchMode):  # records how many K heads each attention kernel call receives
        def __init__(self):
            super().__init__()
            self.heads = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if "scaled_dot_product" in func.__name__ and "backward" not in func.__name__:
                self.heads.append(args[1].shape[1])
            return func(*args, **(kwargs or {}))

    args = tiny_args(dim=32, n_heads=8, n_kv_heads=2, max_seq_len=16)
    model = init_model(args)
    attn = model.layers["0"].attention
    x = torch.randn(2, 10, args.dim)
    results = {}
    for native in (True, False):
        attn.native_gqa = native
        xi = x.clone().requires_grad_()
        attn.zero_grad()
        with KeyHeads() as mode:
            out = attn(xi, model.freqs_cis[:10])
        out.square().sum().backward()
        results[native] = (out.detach(), xi.grad, attn.wk.weight.grad.clone(), attn.wv.weight.grad.clone())
        assert mode.heads[-1] == (2 if native else 8)
    for a, b in zip(results[True], results[False]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_rotary_matches_complex_form():
    args = tiny_args()
    x = torch.randn(2, 12, 3, args.head_dim)
    freqs_cis = precompute_freqs_cis(args)[:12]
    cis = torch.view_as_complex(freqs_cis.contiguous())
    expected = torch.view_as_real(
        torch.view_as_complex(x.reshape(2, 12, 3, -1, 2)) * cis[None, :, None]
    ).flatten(-2)
    torch.testing.assert_close(apply_rotary_emb(x, freqs_cis), expected)


def test_rotary_under_compile_is_the_real_form_with_the_same_values():
    """torch.compile traces the real-arithmetic rotation (Inductor has no code generation for complex operators):
    the eager complex values to fp32 rounding (the complex kernel's scalar path may round one product-sum
    differently: one ulp), for training's table [S, hd/2, 2] and generation's per-row [B, S, hd/2, 2]."""
    args = tiny_args()
    table = precompute_freqs_cis(args)
    x = torch.randn(2, 12, 3, args.head_dim)
    per_row = table[torch.tensor([[3] * 12, list(range(5, 17))])]
    compiled = torch.compile(apply_rotary_emb, fullgraph=True)
    for freqs_cis in (table[:12], per_row):
        eager = apply_rotary_emb(x, freqs_cis)
        torch.testing.assert_close(_apply_rotary_emb_real(x, freqs_cis), eager, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(compiled(x, freqs_cis), eager, rtol=1e-6, atol=1e-6)
        bf16 = compiled(x.bfloat16(), freqs_cis)
        assert bf16.dtype == torch.bfloat16
        torch.testing.assert_close(bf16, apply_rotary_emb(x.bfloat16(), freqs_cis), rtol=0.008, atol=1e-5)


def test_rope_scaling_formula():
    head_dim, theta = 128, 500000.0
    base = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    scaled = rope_frequencies(head_dim, theta, RopeScaling(factor=8.0)).double()
    torch.testing.assert_close(rope_frequencies(head_dim, theta, None).double(), base, rtol=1e-6, atol=0)
    # Meta's apply_scaling, one frequency at a time: keep wavelength < 8192/4, divide by 8 beyond 8192/1
    n_kept = n_divided = n_mixed = 0
    for f, got in zip(base.tolist(), scaled.tolist()):
        wavelen = 2 * math.pi / f
        if wavelen < 8192 / 4:
            want, n_kept = f, n_kept + 1
        elif wavelen > 8192 / 1:
            want, n_divided = f / 8, n_divided + 1
        else:
            s = (8192 / wavelen - 1) / (4 - 1)
            want, n_mixed = (1 - s) * f / 8 + s * f, n_mixed + 1
        assert got == pytest.approx(want, rel=1e-5)
    assert n_kept and n_divided and n_mixed  # all three regimes exercised
    assert scaled[0] == pytest.approx(base[0].item(), rel=1e-6)  # highest frequency unchanged
    assert scaled[-1] == pytest.approx(base[-1].item() / 8, rel=1e-5)  # lowest divided by the factor
    # a flavor's table uses its scaling
    a = llama3_flavors["8B"]
    table = precompute_freqs_cis(get_model_args("8B", max_seq_len=4))
    torch.testing.assert_close(
        table[1, :, 1], torch.sin(rope_frequencies(a.head_dim, a.rope_theta, a.rope_scaling))
    )


# ----------------------------------------------------------------------------------------------------- learning


def test_tiny_model_overfits_one_batch():
    torch.manual_seed(0)
    args = tiny_args(dim=64, n_layers=2, vocab_size=64)
    model = init_model(args)
    tokens = torch.randint(0, args.vocab_size, (4, 17))
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        loss = F.cross_entropy(model(inputs).float().flatten(0, 1), labels.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(p.grad is not None for p in model.parameters())
    assert losses[0] > 3.5  # about ln(64) = 4.16 at init
    assert losses[-1] < 0.25 * losses[0], losses
