"""Hugging Face interchange: random-weight LlamaForCausalLM models of several shapes -> our DCP -> our model gives
transformers' logits (fp32, max abs difference < 1e-4); HF -> ours -> HF gives identical tensors; a run starts
from converted weights (checkpoint.initial_load_path) with a HF tokenizer.json through the trainer config."""

import json
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, TINY, run_train
from torchtitan.checkpoint.hf import dcp_to_hf, hf_to_dcp, load_dcp_model, read_hf_checkpoint
from torchtitan.models.llama3 import Transformer

transformers = pytest.importorskip("transformers")

LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,  # small, so the scaling changes frequencies used at 32 positions
}
SHAPES = {
    "mha_untied": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, intermediate_size=176),
    "gqa4_tied_scaled": dict(
        hidden_size=64,
        num_attention_heads=8,
        num_key_value_heads=2,
        intermediate_size=160,
        tie_word_embeddings=True,
        rope_scaling=LLAMA3_SCALING,
    ),
    "mqa_untied_scaled": dict(
        hidden_size=96,
        num_attention_heads=6,
        num_key_value_heads=1,
        intermediate_size=250,
        rope_scaling=LLAMA3_SCALING,
    ),
}


def make_hf_model(folder, vocab_size=128, n_layers=2, seed=0, **shape):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=vocab_size,
        num_hidden_layers=n_layers,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        max_position_embeddings=64,
        attn_implementation="eager",
        **shape,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # HF initializes norms to ones: randomize them so a swapped norm would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    # small shards, so the sharded layout with model.safetensors.index.json is what we read
    model.save_pretrained(folder, safe_serialization=True, max_shard_size="50KB")
    return model


@pytest.mark.parametrize("shape", SHAPES)
def test_logits_match_transformers_and_round_trip_is_exact(tmp_path, shape):
    hf = make_hf_model(tmp_path / "hf", **SHAPES[shape])
    assert (tmp_path / "hf" / "model.safetensors.index.json").exists()
    args = hf_to_dcp(tmp_path / "hf", tmp_path / "dcp")
    assert args.tie_embeddings == bool(SHAPES[shape].get("tie_word_embeddings"))
    assert (args.rope_scaling is not None) == ("rope_scaling" in SHAPES[shape])

    ours = Transformer(args)
    ours.init_weights(seed=123)  # anything; every parameter is overwritten by the load below
    ours.load_state_dict(load_dcp_model(tmp_path / "dcp"), strict=True)
    tokens = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(tokens).logits
        got = ours(tokens)
    assert (got - expected).abs().max().item() < 1e-4

    dcp_to_hf(tmp_path / "dcp", tmp_path / "back", args, max_shard_bytes=40_000)
    _, original = read_hf_checkpoint(tmp_path / "hf")
    _, back = read_hf_checkpoint(tmp_path / "back")
    if args.tie_embeddings:
        original.pop("lm_head.weight", None)
    assert sorted(back) == sorted(original)
    for name in original:
        assert torch.equal(back[name], original[name]), name
    # and transformers itself loads what we wrote (legacy rope_theta/rope_scaling keys, as Meta publishes them)
    reloaded = transformers.LlamaForCausalLM.from_pretrained(
        tmp_path / "back", attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        assert torch.equal(reloaded(tokens).logits, expected)


def _tokenizer_json(path, vocab_size):
    from tokenizers import Tokenizer, models, pre_tokenizers

    corpus = (ROOT / "tests/assets/debug_corpus/train.jsonl").read_text().split()
    words = ["<unk>", "<|begin_of_text|>", "<|end_of_text|>"]
    for w in corpus:
        if w not in words and len(words) < vocab_size:
            words.append(w)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>"])
    tok.save(str(path))


def test_run_starts_from_converted_weights_with_hf_tokenizer(tmp_path):
    """debugmodel-shaped HF weights (vocab 512) + a tokenizer.json -> a 1-step run with lr 0 from
    checkpoint.initial_load_path, exported at the end and converted back: the same tensors came out."""
    vocab = 512
    make_hf_model(
        tmp_path / "hf",
        vocab_size=vocab,
        n_layers=6,
        hidden_size=256,
        num_attention_heads=16,
        num_key_value_heads=4,
        intermediate_size=768,
    )
    r = subprocess.run(
        [sys.executable, "scripts/convert_hf_to_dcp.py", str(tmp_path / "hf"), str(tmp_path / "dcp")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    _tokenizer_json(tmp_path / "tokenizer.json", vocab)
    out = tmp_path / "run"
    r = run_train(
        1,
        TINY
        + [
            f"--job.dump_folder={out}",
            f"--model.tokenizer_path={tmp_path / 'tokenizer.json'}",
            f"--model.vocab_size={vocab}",
            "--model.max_seq_len=64",
            "--training.steps=1",
            "--training.mixed_precision_param=float32",
            "--optimizer.lr=0",
            "--metrics.peak_tflops=1",
            "--checkpoint.enable=true",
            f"--checkpoint.initial_load_path={tmp_path / 'dcp'}",
            "--checkpoint.last_save_model_only=true",
        ],
    )
    assert r.returncode == 0
    assert "loaded model weights from" in r.stdout
    marker = json.loads((out / "checkpoint" / "step-1" / "COMMITTED.json").read_text())
    assert marker["kind"] == "export"
    r = subprocess.run(
        [
            sys.executable,
            "scripts/convert_dcp_to_hf.py",
            str(out / "checkpoint" / "step-1"),
            str(tmp_path / "back"),
            "--flavor=debugmodel",
            f"--vocab_size={vocab}",
            "--max_seq_len=64",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    _, original = read_hf_checkpoint(tmp_path / "hf")
    _, back = read_hf_checkpoint(tmp_path / "back")
    assert sorted(back) == sorted(original)
    for name in original:
        assert torch.equal(back[name], original[name]), name


# config.json as Meta and transformers wrote it in other eras: Llama 2 (2023-07: no rope_theta, rope_scaling null),
# Llama 3.1 with the pre-4.45 "type" key, transformers >= 5's rope_parameters; and what is refused in one line.
_LLAMA2_7B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
              "num_hidden_layers": 32, "vocab_size": 32000, "rms_norm_eps": 1e-05, "rope_scaling": None,
              "max_position_embeddings": 4096, "pretraining_tp": 1}  # fmt: skip
_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


@pytest.mark.parametrize(
    "extra, theta, scaled",
    [
        ({}, 10000.0, False),  # Llama 2: RoPE base 10,000 by default
        ({"rope_theta": 500000.0, "rope_scaling": {"type": "llama3", **_SCALING}}, 500000.0, True),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, **_SCALING}}, 500000.0, True),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}, 500000.0, False),
    ],
)
def test_config_json_of_other_eras(extra, theta, scaled):
    from torchtitan.checkpoint.hf import model_args_from_hf_config

    args = model_args_from_hf_config({**_LLAMA2_7B, **extra})
    assert args.ffn_hidden_dim == 11008 and args.n_kv_heads == 32 and args.rope_theta == theta
    assert (args.rope_scaling is not None) == scaled


@pytest.mark.parametrize(
    "extra, words",
    [
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling type 'linear' is not supported"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_scaling type 'dynamic'"),
        ({"attention_bias": True}, "attention_bias = true"),
        ({"model_type": "mistral"}, "model_type 'mistral'"),
        ({"head_dim": 256}, "head_dim=256"),
    ],
)
def test_config_json_that_cannot_be_read_is_one_line(extra, words):
    from torchtitan.checkpoint.hf import model_args_from_hf_config
    from torchtitan.errors import UserError

    with pytest.raises(UserError, match=words) as e:
        model_args_from_hf_config({**_LLAMA2_7B, **extra}, "ckpt/config.json")
    assert "ckpt/config.json" in str(e.value) and "\n" not in str(e.value)
