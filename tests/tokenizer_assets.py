"""Tokenizers shaped like torchtitan's test assets, built offline from the debug corpus (nothing downloaded).

- `write_tiktoken_file`: a tiktoken-format BPE file ("<base64 token> <rank>" per line) with `n_ranks` ranks, the
  format of Meta's Llama 3 `original/tokenizer.model`; with Llama 3's 256 special tokens it has n_ranks + 256
  tokens (torchtitan's late-2024 test file: 2,000 ranks -> 2,256).
- `write_hf_folder`: a Hugging Face folder whose tokenizer.json has no BOS/EOS at all: they are declared only in
  tokenizer_config.json (bos_token, eos_token and added_tokens_decoder, at ids beyond the vocabulary), the
  layout of torchtitan's later test tokenizer (2,002 entries; BOS/EOS join as 2,002 and 2,003).

Both are byte-level BPEs trained with the `tokenizers` library on the first documents of the debug corpus.
"""

from __future__ import annotations

import base64
import functools
import json
import random
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "assets" / "debug_corpus" / "train.jsonl"


def _texts(n_docs: int = 600) -> list[str]:
    """Stories of the debug corpus, plus made-up words: the stories alone have too few distinct words for a
    2,000-entry BPE to find that many merges."""
    out = []
    with open(CORPUS) as f:
        for line, _ in zip(f, range(n_docs)):
            out.append(json.loads(line)["text"])
    rng = random.Random(0)
    words = [
        "".join(rng.choice("abcdefghiklmnoprstuvwy") for _ in range(rng.randint(3, 9))) for _ in range(4000)
    ]
    out += [" ".join(words[i : i + 40]) for i in range(0, len(words), 40)] * 2
    return out


@functools.lru_cache(maxsize=4)
def _trained_bpe(vocab_size: int, extra: tuple[str, ...] = ()) -> str:
    """A byte-level BPE of `vocab_size` entries (256 bytes first, then merges in order), as tokenizer.json text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(extra),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_texts(), trainer=trainer)
    assert tok.get_vocab_size() == vocab_size - len(extra), tok.get_vocab_size()
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    for t in extra:  # plain vocabulary entries, as in torchtitan's test tokenizer (<|image|>, <|pad|>, ...)
        vocab[t] = len(vocab)
    return json.dumps(data)


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte <-> printable-character table, which byte-level BPE vocabularies are written in."""
    keep = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    )
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars)}


def write_tiktoken_file(path: Path, n_ranks: int = 2000) -> Path:
    vocab = json.loads(_trained_bpe(n_ranks))["model"]["vocab"]
    dec = _byte_decoder()
    lines = []
    for token, rank in sorted(vocab.items(), key=lambda kv: kv[1]):
        raw = bytes(dec[c] for c in token)
        lines.append(f"{base64.b64encode(raw).decode()} {rank}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def write_hf_folder(folder: Path, n_entries: int = 2002) -> Path:
    specials = ("<|image|>", "<|begin_of_image|>", "<|end_of_image|>", "<|pad|>")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(_trained_bpe(n_entries, specials))
    decoder = {
        str(i): {"content": t, "special": True, "normalized": False}
        for i, t in [(128000, "<|begin_of_text|>"), (128001, "<|end_of_text|>")]
        + [(n_entries - len(specials) + k, t) for k, t in enumerate(specials)]
    }
    config = {
        "added_tokens_decoder": decoder,
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|end_of_text|>",
        "pad_token": "<|pad|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return folder
