"""Tokenizers: sentencepiece, tiktoken (Meta's Llama 3 `tokenizer.model`) and Hugging Face, behind one interface.

The data pipeline only needs text -> ids with explicit control over BOS/EOS (it frames every document itself),
ids -> text for humans, and the vocabulary size to check against the model's embedding. Training, generation
and perplexity all build their tokenizer here (`build_tokenizer`), from `model.tokenizer_path`: a file or a
folder. The format of a file is read from its content, not only its name: Meta's Llama 3 `tokenizer.model` is
a tiktoken BPE file (text lines "<base64 token> <rank>"), a Llama 2 `tokenizer.model` is sentencepiece.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from pathlib import Path

from torchtitan.errors import UserError

_REPO_ROOT = Path(__file__).resolve().parents[2]
_ACCEPTED = (
    "a sentencepiece .model file, a tiktoken BPE file (Llama 3's original/tokenizer.model), a Hugging Face"
    " tokenizer.json (with its tokenizer_config.json beside it, if any), or a folder holding one of them"
)

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
            raise UserError(
                f"tokenizer {self.path} is not a readable sentencepiece model ({str(e).splitlines()[0][:120]});"
                f" expected {_ACCEPTED}"
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


# Llama 3's tiktoken setup, as Meta's reference tokenizer defines it (github.com/meta-llama/llama3,
# llama/tokenizer.py): the pre-tokenizer split pattern, and 256 special tokens numbered after the BPE ranks:
# <|begin_of_text|>, <|end_of_text|>, reserved 0-3, <|start_header_id|>, <|end_header_id|>, reserved 4,
# <|eot_id|>, then reserved 5..250. (Llama 3.1 renamed some reserved ones; the ids, BOS and EOS are the same.)
LLAMA3_PAT_STR = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
LLAMA3_NUM_SPECIAL_TOKENS = 256
LLAMA3_SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|reserved_special_token_2|>",
    "<|reserved_special_token_3|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|reserved_special_token_4|>",
    "<|eot_id|>",
] + [f"<|reserved_special_token_{i}|>" for i in range(5, LLAMA3_NUM_SPECIAL_TOKENS - 5)]
# Meta's reference encodes at most 400k characters per call and splits runs of more than 25k consecutive
# whitespace or non-whitespace characters, which would otherwise overflow the regex engine's stack.
_TIKTOKEN_MAX_CHARS = 400_000
_TIKTOKEN_MAX_RUN = 25_000
_LONG_RUN = re.compile(rf"\s{{{_TIKTOKEN_MAX_RUN + 1}}}|\S{{{_TIKTOKEN_MAX_RUN + 1}}}")
_TIKTOKEN_LINE = re.compile(rb"^[A-Za-z0-9+/]+=*[ \t]+[0-9]+$")


def _split_long_runs(text: str):
    """Pieces of `text` with at most _TIKTOKEN_MAX_RUN consecutive whitespace or non-whitespace characters."""
    if not _LONG_RUN.search(text):
        yield text
        return
    start, run, prev = 0, 0, None
    for i, ch in enumerate(text):
        ws = ch.isspace()
        run = run + 1 if ws == prev else 1
        prev = ws
        if run > _TIKTOKEN_MAX_RUN:
            yield text[start:i]
            start, run = i, 1
    yield text[start:]


def _read_tiktoken_ranks(path: str) -> dict[bytes, int]:
    """The BPE ranks of a tiktoken file: one "<base64 token> <rank>" per line (what tiktoken.load reads; parsed
    here so an error names the line, and no cache keyed by the path can serve a stale copy)."""
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            parts = line.split()
            try:
                token, rank = base64.b64decode(parts[0], validate=True), int(parts[1])
                if len(parts) != 2:
                    raise ValueError
            except (IndexError, ValueError, binascii.Error):
                raise UserError(
                    f"tokenizer {path} line {n} is not '<base64 token> <rank>' (tiktoken BPE format)"
                ) from None
            ranks[token] = rank
    if not ranks:
        raise UserError(f"tokenizer {path} is empty; expected {_ACCEPTED}")
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise UserError(f"tokenizer {path}: the ranks of its {len(ranks)} tokens are not 0..{len(ranks) - 1}")
    return ranks


class TiktokenTokenizer(Tokenizer):
    """Meta's Llama 3 `tokenizer.model` (the `original/` folder of its releases), read through `tiktoken`.

    The vocabulary is the file's BPE ranks followed by Llama 3's 256 special tokens (128,000 + 256 = 128,256 for
    Llama 3; a 2,000-rank test file gives 2,256). BOS = <|begin_of_text|>, EOS = <|end_of_text|>. Text that
    looks like a special token is encoded as ordinary text: only the data pipeline inserts BOS/EOS.
    """

    def __init__(self, path: str | Path):
        import tiktoken

        self.path = str(path)
        ranks = _read_tiktoken_ranks(self.path)
        n = len(ranks)
        specials = {t: n + i for i, t in enumerate(LLAMA3_SPECIAL_TOKENS)}
        try:
            self.enc = tiktoken.Encoding(
                name=Path(self.path).name,
                pat_str=LLAMA3_PAT_STR,
                mergeable_ranks=ranks,
                special_tokens=specials,
            )
        except Exception as e:  # tiktoken's core raises plain exceptions on inconsistent ranks
            raise UserError(f"tokenizer {self.path} is not a usable tiktoken BPE file: {e}") from None
        self.vocab_size = n + len(specials)
        self.bos_id, self.eos_id = specials["<|begin_of_text|>"], specials["<|end_of_text|>"]
        self.special_tokens = specials

    def _encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for i in range(0, len(text), _TIKTOKEN_MAX_CHARS):
            for piece in _split_long_runs(text[i : i + _TIKTOKEN_MAX_CHARS]):
                ids.extend(self.enc.encode(piece, allowed_special=set(), disallowed_special=()))
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.enc.decode(list(ids))


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
        config = self._read_config()
        self._add_config_tokens(config)
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        self.bos_id, self.eos_id = self._find_bos_eos(config)

    def _read_config(self) -> dict:
        """tokenizer_config.json beside the file ({} if none): Hugging Face model repos declare their special
        tokens there (bos_token, eos_token, added_tokens_decoder)."""
        cfg = Path(self.path).with_name("tokenizer_config.json")
        if not cfg.is_file():
            return {}
        try:
            c = json.loads(cfg.read_text())
        except (OSError, ValueError) as e:
            raise UserError(f"{cfg} is not readable JSON ({str(e)[:120]}); fix or remove it") from None
        return c if isinstance(c, dict) else {}

    def _add_config_tokens(self, config: dict) -> None:
        """Special tokens declared only in tokenizer_config.json join the vocabulary, as transformers' tokenizer
        classes do: added_tokens_decoder in id order, then bos_token/eos_token. Each missing one gets the next id
        after the vocabulary (the id the config wrote may be beyond it, as in small test tokenizers)."""
        from tokenizers import AddedToken

        declared = []
        decoder = config.get("added_tokens_decoder") or {}
        for key in sorted(decoder, key=lambda k: int(k) if str(k).isdigit() else 0):
            entry = decoder[key]
            if isinstance(entry, dict) and isinstance(entry.get("content"), str):
                declared.append(entry["content"])
        declared += [
            t for t in (_token_name(config.get("bos_token")), _token_name(config.get("eos_token"))) if t
        ]
        vocab = self.tok.get_vocab(with_added_tokens=True)
        missing = [t for t in dict.fromkeys(declared) if t not in vocab]
        if missing:
            self.tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in missing])

    def _find_bos_eos(self, config: dict) -> tuple[int, int]:
        vocab = self.tok.get_vocab(with_added_tokens=True)
        # The config names them authoritatively; else the usual names.
        bos, eos = _token_name(config.get("bos_token")), _token_name(config.get("eos_token"))
        bos = bos if bos in vocab else next((t for t in _BOS_NAMES if t in vocab), None)
        eos = eos if eos in vocab else next((t for t in _EOS_NAMES if t in vocab), None)
        if eos is None:
            raise UserError(
                f"tokenizer {self.path} has none of the end-of-text tokens {', '.join(_EOS_NAMES)} and no"
                " tokenizer_config.json beside it naming an eos_token; add one or use a tokenizer that defines it"
            )
        # GPT-2-style vocabularies have a single <|endoftext|> that serves as both document separators.
        return vocab[bos if bos is not None else eos], vocab[eos]

    def _encode(self, text: str) -> list[int]:
        # add_special_tokens=False: Llama 3's post-processor would prepend BOS itself; we frame documents ourselves.
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False)


def _token_name(t) -> str | None:
    """bos_token/eos_token of a tokenizer_config.json: a string or an AddedToken dict {"content": ...}."""
    t = t.get("content") if isinstance(t, dict) else t
    return t if isinstance(t, str) and t else None


def _resolve(path: str) -> Path:
    p = Path(path).expanduser()
    # Relative defaults such as tests/assets/tokenizer/debug.model should work from any working directory.
    if not p.exists() and not p.is_absolute() and (_REPO_ROOT / p).exists():
        return _REPO_ROOT / p
    return p


def tokenizer_format(p: Path) -> str | None:
    """'tiktoken', 'sentencepiece', 'hf' or None, from the file's content (and its name for .json)."""
    if p.suffix == ".json":
        return "hf"
    try:
        with open(p, "rb") as f:
            head = f.read(4096)
    except OSError as e:
        raise UserError(f"tokenizer {p} cannot be read: {e.strerror}") from None
    first = head.split(b"\n", 1)[0].strip()
    if first and _TIKTOKEN_LINE.match(first):
        return "tiktoken"
    if head.lstrip().startswith(b"{"):
        return "hf"
    if p.suffix == ".model" and head:  # binary protobuf; sentencepiece says so itself if it is not one
        return "sentencepiece"
    return None


# A folder: the first of these that exists. tokenizer.json is richer than a Llama 2 tokenizer.model; Meta's
# Llama 3 downloads put the tiktoken file at the top, the Hugging Face repos under original/.
_FOLDER_FILES = ("tokenizer.json", "tokenizer.model", "original/tokenizer.model")


def build_tokenizer(path: str) -> Tokenizer:
    """The tokenizer at `path` (model.tokenizer_path): a file, or a folder holding one (see _FOLDER_FILES)."""
    p = _resolve(path)
    if p.is_dir():
        for name in _FOLDER_FILES:
            if (p / name).is_file():
                return build_tokenizer(str(p / name))
        raise UserError(
            f"tokenizer folder {path} contains neither tokenizer.json nor tokenizer.model (nor"
            f" original/tokenizer.model); expected {_ACCEPTED}"
        )
    if not p.is_file():
        raise UserError(f"tokenizer {path} does not exist; expected {_ACCEPTED}")
    kind = tokenizer_format(p)
    if kind == "tiktoken":
        return TiktokenTokenizer(p)
    if kind == "sentencepiece":
        return SentencePieceTokenizer(p)
    if kind == "hf":
        return HFTokenizer(p)
    raise UserError(
        f"tokenizer {path} is in none of the accepted formats (unknown file type '{p.suffix}'); expected {_ACCEPTED}"
    )
