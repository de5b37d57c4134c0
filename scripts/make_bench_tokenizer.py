#!/usr/bin/env python
"""A Llama-3-sized tokenizer.json for throughput benchmarks of the real flavors, made offline.

    python scripts/make_bench_tokenizer.py --out /tmp/tok128k            # 128,256 entries (Llama 3)
    python train.py --model.flavor=1B --model.tokenizer_path=/tmp/tok128k/tokenizer.json ...

The 1B-405B flavors have a 128,256-entry vocabulary, and the trainer requires the tokenizer to match the model
(model.vocab_size must equal it). Llama 3's own tokenizer cannot be downloaded here, so this trains a byte-level
BPE of 4,096 pieces on the shipped debug corpus (Hugging Face `tokenizers`) and pads it with reserved special
tokens to the size asked for, as Llama 3 pads its vocabulary with <|reserved_special_token_N|>. Only the first
pieces ever occur in the data: the embedding and output head have the real shape and cost, the text is the debug
corpus. For speed and memory figures only: losses from it are not comparable with Llama 3's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "assets" / "debug_corpus" / "train.jsonl"
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>"]


BPE_PIECES = 4096


def make(out: Path, vocab_size: int, bpe_pieces: int = BPE_PIECES) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_pieces,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    with open(CORPUS, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    tok.train_from_iterator(texts, trainer=trainer)
    n = tok.get_vocab_size(with_added_tokens=True)
    tok.add_special_tokens([f"<|reserved_special_token_{i}|>" for i in range(vocab_size - n)])
    assert tok.get_vocab_size(with_added_tokens=True) == vocab_size
    out.mkdir(parents=True, exist_ok=True)
    path = out / "tokenizer.json"
    tok.save(str(path))
    return path


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for tokenizer.json")
    p.add_argument("--vocab_size", type=int, default=128256, help="entries in all (Llama 3: 128256)")
    a = p.parse_args()
    if a.vocab_size < BPE_PIECES + len(SPECIALS):
        print(
            f"error: --vocab_size {a.vocab_size} must be at least {BPE_PIECES + len(SPECIALS)}",
            file=sys.stderr,
        )
        return 2
    print(make(a.out, a.vocab_size))
    return 0


if __name__ == "__main__":
    sys.exit(main())
