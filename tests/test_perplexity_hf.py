"""scripts/perplexity.py on a Hugging Face Llama folder (config.json + safetensors), found the way
scripts/generate.py finds it: the perplexity equals exp(mean cross-entropy) that transformers' own model computes
on the same validation batches, tensor parallel over 2 processes agrees with 1 process, and a folder that does not
fit (vocab size, not a Llama) is one line, exit 2.

Tiny random LlamaForCausalLMs (tests/test_checkpoint_hf.py's fixture: 2 layers, dim 64, 8 heads, 2 kv heads,
Llama 3 RoPE scaling; tied and untied embeddings, TP on the untied one: tensor parallel does not take tied ones)
with the debug tokenizer's 2048-token vocabulary; seq_len 64, 2 batches of 4 sequences of the debug corpus's
validation split, fp32. Tolerances: the two implementations differ in the order of floating-point sums only
(measured: 3e-8 relative on the loss tied, 0 untied; TP 2 against 1 process: 0); 1e-5 on the loss (1e-4 on the
perplexity, exp of a loss of ~7.6) catches a wrong weight, a shifted label or a missing token, which move it by
far more.
"""

import json

import pytest
import torch

from conftest import run_script

transformers = pytest.importorskip("transformers")
from test_checkpoint_hf import SHAPES, make_hf_model  # noqa: E402

ARGS = [
    "--job.config_file=train_configs/debug_model.toml",
    "--training.seq_len=64",
    "--training.local_batch_size=4",
    "--training.mixed_precision_param=float32",
    "--validation.steps=2",
]
SHAPE = SHAPES["gqa4_tied_scaled"]


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """{"tied" | "untied": (folder, the transformers model saved there)}"""
    root = tmp_path_factory.mktemp("hf")
    models = {}
    for kind in ("tied", "untied"):
        shape = {**SHAPE, "tie_word_embeddings": kind == "tied"}
        models[kind] = root / kind, make_hf_model(root / kind, vocab_size=2048, **shape)
    return models


def perplexity(nproc: int, args: list[str], tmp_path):
    out = tmp_path / f"ppl{nproc}.json"
    r = run_script(nproc, "scripts/perplexity.py", [*ARGS, *args, f"--json={out}"], timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(out.read_text()), r.stdout


def transformers_loss(model) -> tuple[float, int]:
    """Mean token cross-entropy by transformers' forward(labels=...) over the validation batches the script reads
    (torchtitan.evaluate.load_validation_batches, one data-parallel rank)."""
    from torchtitan.config import parse_args
    from torchtitan.data import build_tokenizer
    from torchtitan.evaluate import load_validation_batches
    from torchtitan.parallel import ParallelDims

    cfg = parse_args(ARGS)
    dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, world_size=1)
    batches = load_validation_batches(cfg, build_tokenizer(cfg.model.tokenizer_path), dims, 0)
    losses, tokens = [], 0
    with torch.no_grad():
        for inputs, labels in batches:
            window = torch.cat([inputs[:, :1], labels], dim=1)  # the seq_len + 1 tokens; HF shifts itself
            losses.append(model(input_ids=window, labels=window).loss.double())
            tokens += labels.numel()
    # every batch has the same number of tokens, so the mean of the batch means is the token mean
    return torch.stack(losses).mean().item(), tokens


@pytest.fixture(scope="module")
def one_process(hf, tmp_path_factory):
    """perplexity.py in 1 process on an HF folder, run once per folder: the tensor-parallel test below compares
    with the same run."""
    cache = {}

    def get(kind):
        if kind not in cache:
            folder, _ = hf[kind]
            cache[kind] = perplexity(1, [f"--checkpoint={folder}"], tmp_path_factory.mktemp(f"one_{kind}"))
        return cache[kind]

    return get


@pytest.mark.parametrize("kind", ["tied", "untied"])
def test_perplexity_of_hf_folder_equals_transformers(hf, one_process, kind):
    folder, model = hf[kind]
    result, stdout = one_process(kind)
    loss, tokens = transformers_loss(model)
    assert result["tokens"] == tokens == 2 * 4 * 64 and result["step"] is None
    assert result["loss"] == pytest.approx(loss, rel=1e-5), (result["loss"], loss)
    assert result["perplexity"] == pytest.approx(torch.tensor(loss).exp().item(), rel=1e-4)
    assert (
        5.0 < loss < 10.0
    )  # a random model over 2048 tokens: about ln(2048) = 7.6, not a degenerate 0 or inf
    last = stdout.splitlines()[-1]
    assert last.startswith("perplexity ") and f"checkpoint {folder} (Hugging Face)" in last


@pytest.mark.slow
def test_hf_folder_tensor_parallel_agrees_with_one_process(hf, one_process, tmp_path):
    folder, _ = hf["untied"]  # tensor parallel refuses tied embeddings (parallel/dims.py), ours too
    one, _ = one_process("untied")
    two, _ = perplexity(2, [f"--checkpoint={folder}", "--parallelism.tensor_parallel_degree=2"], tmp_path)
    assert two["world_size"] == 2
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-5), (two["loss"], one["loss"])


def _not_llama(folder):
    from safetensors.torch import save_file

    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 64, "vocab_size": 2048}))
    save_file({"wte.weight": torch.zeros(2048, 64)}, str(folder / "model.safetensors"))


@pytest.mark.parametrize(
    "case, message",
    [
        (
            "vocab",
            "config.json has vocab_size 128 but tokenizer tests/assets/tokenizer/debug.model has 2048 tokens",
        ),
        ("gpt2", "config.json has model_type 'gpt2': not a Hugging Face Llama checkpoint; valid: 'llama'"),
    ],
)
def test_hf_folder_that_does_not_fit_is_one_line_exit_2(tmp_path, case, message):
    folder = tmp_path / case
    if case == "vocab":
        make_hf_model(folder, vocab_size=128, **SHAPE)
    else:
        _not_llama(folder)
    r = run_script(1, "scripts/perplexity.py", [*ARGS, f"--checkpoint={folder}"], timeout=300)
    assert r.returncode == 2, r.stderr[-3000:]
    err = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and message in err[0] and str(folder) in err[0], r.stderr[-3000:]
    assert "Traceback" not in r.stderr
