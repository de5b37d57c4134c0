"""Tokenizers: a sentencepiece `.model` or a Hugging Face `tokenizer.json`, behind one small interface.

The data pipeline only needs text -> ids with explicit control over BOS/EOS (it frames every document itself),
ids -> text for humans, and the vocabulary size to check against the model's embedding.
"""

from __future__ import annotations

import json
from pathlib import Path

from torchtitan.errors import UserError

_REPO_ROOT = Path(__file__).resolve().parents[2]
_ACCEPTED = "a sentencepiece .model file, a Hugging Face tokenizer.json, or a folder containing one of them"

# Special tokens that mark document starts/ends in common tokenizer.json files, most specific first.
_BOS_NAMES = ("<|begin_of_text|>", "<s>", "<|startoftext|>", "<bos>")
_EOS_NAMES = ("<|end_of_text|>", "</s>", "<|endoftext|>", "<eos>")


class Tokenizer:
    """What the data pipeline needs from a tokenizer."""

    vocab_size: int
    bos_id: int
    eos_id: int

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        ids = self._encode(text)
        return ([self.bos_id] if bos else []) + ids + ([self.eos_id] if eos else [])

    def _encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: list[int]) -> str:
        raise NotImplementedError


class SentencePieceTokenizer(Tokenizer):
    def __init__(self, path: str | Path):
        import sentencepiece as spm

        self.path = str(path)
        try:
            self.sp = spm.SentencePieceProcessor(model_file=self.path)
        except (OSError, RuntimeError) as e:
            # Meta's original Llama 3 tokenizer.model is a tiktoken file, not sentencepiece.
            raise UserError(
                f"tokenizer {self.path} is not a readable sentencepiece model ({str(e).splitlines()[0][:120]}); "
                "for Llama 3 use the Hugging Face tokenizer.json instead of original/tokenizer.model"
            ) from None
        self.vocab_size = self.sp.vocab_size()
        self.bos_id, self.eos_id = self.sp.bos_id(), self.sp.eos_id()
        if self.bos_id < 0 or self.eos_id < 0:
            raise UserError(
                f"tokenizer {self.path} defines no BOS/EOS piece; train it with bos_id/eos_id >= 0"
            )

    def _encode(self, text: str) -> list[int]:
        return self.sp.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.sp.decode(list(ids))


class HFTokenizer(Tokenizer):
    """A Hugging Face `tokenizers` tokenizer.json (Llama 3 ships one)."""

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer as _HF

        self.path = str(path)
        try:
            self.tok = _HF.from_file(self.path)
        except Exception as e:  # tokenizers raises plain Exception subclasses for bad JSON / unknown models
            raise UserError(
                f"tokenizer {self.path} is not a readable Hugging Face tokenizer.json ({str(e).splitlines()[0][:120]})"
            ) from None
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        self.bos_id, self.eos_id = self._find_bos_eos()

    def _find_bos_eos(self) -> tuple[int, int]:
        vocab = self.tok.get_vocab(with_added_tokens=True)
        # A tokenizer_config.json beside the file names them authoritatively (Hugging Face model repos have one).
        bos = eos = None
        cfg = Path(self.path).with_name("tokenizer_config.json")
        if cfg.is_file():
            try:
                c = json.loads(cfg.read_text())
            except (OSError, ValueError):
                c = {}
            bos, eos = (
                t.get("content") if isinstance(t, dict) else t
                for t in (c.get("bos_token"), c.get("eos_token"))
            )
        bos = bos if bos in vocab else next((t for t in _BOS_NAMES if t in vocab), None)
        eos = eos if eos in vocab else next((t for t in _EOS_NAMES if t in vocab), None)
        if eos is None:
            raise UserError(
                f"tokenizer {self.path} has none of the end-of-text tokens {', '.join(_EOS_NAMES)}; "
                "add one or use a tokenizer that defines it"
            )
        # GPT-2-style vocabularies have a single <|endoftext|> that serves as both document separators.
        return vocab[bos if bos is not None else eos], vocab[eos]

    def _encode(self, text: str) -> list[int]:
        # add_special_tokens=False: Llama 3's post-processor would prepend BOS itself; we frame documents ourselves.
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False)


def _resolve(path: str) -> Path:
    p = Path(path).expanduser()
    # Relative defaults such as tests/assets/tokenizer/debug.model should work from any working directory.
    if not p.exists() and not p.is_absolute() and (_REPO_ROOT / p).exists():
        return _REPO_ROOT / p
    return p


def build_tokenizer(path: str) -> Tokenizer:
    """Pick the tokenizer class from the file type: .model -> sentencepiece, .json -> Hugging Face."""
    p = _resolve(path)
    if p.is_dir():
        for name in (
            "tokenizer.json",
            "tokenizer.model",
        ):  # HF repos ship both for Llama 2; the .json is richer
            if (p / name).is_file():
                return build_tokenizer(str(p / name))
        raise UserError(
            f"tokenizer folder {path} contains neither tokenizer.json nor tokenizer.model; expected {_ACCEPTED}"
        )
    if not p.is_file():
        raise UserError(f"tokenizer {path} does not exist; expected {_ACCEPTED}")
    if p.suffix == ".model":
        return SentencePieceTokenizer(p)
    if p.suffix == ".json":
        return HFTokenizer(p)
    raise UserError(f"tokenizer {path} has an unknown file type '{p.suffix}'; expected {_ACCEPTED}")
