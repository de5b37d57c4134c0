"""Data: tokenizers and the packed, sharded, resumable token stream the trainer consumes."""

from torchtitan.data.dataset import DATASETS, TextDataLoader, build_dataloader, check_vocab
from torchtitan.data.tokenizer import HFTokenizer, SentencePieceTokenizer, Tokenizer, build_tokenizer

__all__ = [
    "DATASETS",
    "HFTokenizer",
    "SentencePieceTokenizer",
    "TextDataLoader",
    "Tokenizer",
    "build_dataloader",
    "build_tokenizer",
    "check_vocab",
]
