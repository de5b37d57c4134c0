"""Text source -> tokens -> packed (input, label) windows, one disjoint stream per data-parallel rank.

    documents (HF datasets, streaming)  --split_dataset_by_node-->  this rank's documents
      -> [BOS] + tokens + [EOS] per document, concatenated into one token stream
      -> consecutive windows of seq_len + 1 tokens; input = w[:-1], label = w[1:]
      -> batch_size windows stacked into [batch_size, seq_len] int64 tensors

Packing wastes no tokens on padding; attention is not masked at document boundaries (as in Llama 3 pre-training
at this scale; BOS tells the model a new document started). The one token where two windows meet is the last
label of one window and is never an input, the usual price of non-overlapping windows.

Resume is exact: the loader's state is the HF dataset's own position (documents already pulled) plus our
leftover token buffer and epoch, taken between batches; loading it reproduces the very next batch.
"""

from __future__ import annotations

import glob
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from torchtitan.data.tokenizer import Tokenizer
from torchtitan.errors import UserError

logger = logging.getLogger(__name__)

_REPO_ROOT = Path(__file__).resolve().parents[2]
DEBUG_CORPUS_DIR = _REPO_ROOT / "tests" / "assets" / "debug_corpus"

# File endings -> the `datasets` builder that reads them (compressed variants are read transparently).
_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".txt": "text"}
_COMPRESSION = (".gz", ".bz2", ".xz", ".zst", ".zstd", ".lz4")
_FILE_TYPES = ".json/.jsonl/.parquet/.txt (optionally .gz/.zst/...)"


def _builder_for(path: str) -> str | None:
    name = path.lower()
    for c in _COMPRESSION:
        name = name.removesuffix(c)
    return _BUILDERS.get(Path(name).suffix)


def _load_files(spec: str):
    """A file, a glob or a folder of .json/.jsonl/.parquet/.txt files, streamed by the matching builder."""
    from datasets import load_dataset

    p = Path(spec).expanduser()
    if any(ch in spec for ch in "*?["):
        candidates = sorted(glob.glob(str(p), recursive=True))
    elif p.is_dir():
        candidates = sorted(str(f) for f in p.rglob("*") if f.is_file() and not f.name.startswith("."))
    elif p.is_file():
        candidates = [str(p)]
    else:
        raise UserError(
            f"data.dataset_path {spec} does not exist; expected a {_FILE_TYPES} file, a glob or a folder"
        )
    files = [f for f in candidates if Path(f).is_file() and _builder_for(f)]
    if not files:
        raise UserError(f"data.dataset_path {spec} matches no {_FILE_TYPES} files")
    builders = {_builder_for(f) for f in files}
    if len(builders) > 1:
        raise UserError(
            f"data.dataset_path {spec} mixes file types ({', '.join(sorted(builders))}); use one type"
        )
    # A user's files are one split: everything found is read, whatever split was asked for.
    return load_dataset(builders.pop(), data_files=files, split="train", streaming=True)


def _load_c4(split: str):
    from datasets import load_dataset

    try:
        return load_dataset("allenai/c4", name="en", split=split, streaming=True)
    except Exception as e:  # hub failures come in many types (offline, DNS, auth, missing split)
        raise UserError(
            f"data.dataset=c4 could not be opened from the Hugging Face Hub (allenai/c4, split {split}): "
            f"{str(e).splitlines()[0][:160]}; check the network, or use data.dataset=debug_corpus or data.dataset_path"
        ) from None


def _load_debug_corpus(split: str):
    path = DEBUG_CORPUS_DIR / f"{split}.jsonl"
    if not path.is_file():
        raise UserError(
            f"debug_corpus split '{split}' not found at {path}; splits are train, validation "
            "(regenerate with python scripts/make_assets.py)"
        )
    return _load_files(str(path))


# Built-in sources: name -> (split -> HF IterableDataset). Each yields dicts with a "text" field.
DATASETS: dict[str, Callable] = {"c4": _load_c4, "debug_corpus": _load_debug_corpus}


def _open_source(dataset: str, dataset_path: str | None, split: str):
    if dataset_path:  # the user's files replace the named source's location
        return _load_files(dataset_path), f"data.dataset_path {dataset_path}"
    if dataset not in DATASETS:
        raise UserError(
            f"data.dataset '{dataset}' is unknown; built-in sources are {', '.join(sorted(DATASETS))}, "
            "or set data.dataset_path to your own files"
        )
    return DATASETS[dataset](split), f"data.dataset {dataset}"


def _check_text_field(ds, text_field: str, where: str) -> None:
    columns = ds.column_names  # known up front for parquet; json/text only reveal it on the first row
    if columns is None:
        first = next(iter(ds), None)
        if first is None:
            raise UserError(f"{where} contains no rows")
        columns = list(first)
    if text_field not in columns:
        raise UserError(
            f"data.text_field '{text_field}' is not a column of {where}; columns are {', '.join(columns)}"
        )


class _Exhausted(Exception):
    pass


class TextDataLoader:
    """Iterable over (inputs, labels) batches for one data-parallel rank, with exact state_dict/load_state_dict.

    Iterating continues from the current position (it does not restart), so `iter()` may be called again after
    load_state_dict. With infinite=True (default) the source restarts at its end, logging the new epoch number.
    """

    def __init__(
        self,
        hf_dataset,
        tokenizer: Tokenizer,
        text_field: str,
        dp_rank: int,
        dp_world_size: int,
        batch_size: int,
        seq_len: int,
        infinite: bool = True,
        name: str = "dataset",
    ):
        from datasets.distributed import split_dataset_by_node

        if not 0 <= dp_rank < dp_world_size:
            raise ValueError(f"dp_rank {dp_rank} outside [0, {dp_world_size})")
        # One source file -> every rank reads it and keeps 1 document in dp_world_size; with a multiple of
        # dp_world_size files, whole files are assigned to ranks. Either way the ranks' documents are disjoint.
        self.ds = split_dataset_by_node(hf_dataset, rank=dp_rank, world_size=dp_world_size)
        self.tokenizer, self.text_field, self.name = tokenizer, text_field, name
        self.dp_rank, self.dp_world_size = dp_rank, dp_world_size
        self.batch_size, self.seq_len, self.infinite = batch_size, seq_len, infinite

        self._buffer: list[int] = []  # tokens of documents already pulled, not yet emitted
        self._epoch = 0
        self._it: Iterator | None = None  # live iterator over self.ds; None until the next document is needed
        self._hf_state: dict | None = None  # position to report while self._it is None
        self._docs_this_pass = 0  # non-empty documents read since the source (re)started
        self._pass_from_start = True

    # -- the stream ----------------------------------------------------------------------------------------

    def _next_tokens(self) -> list[int]:
        """Tokens of the next document of this rank, framed by BOS/EOS. Restarts the source at its end."""
        while True:
            if self._it is None:
                self.ds.set_epoch(self._epoch)  # the HF state records its epoch; a later epoch starts fresh
                self._it = iter(self.ds)
            try:
                row = next(self._it)
            except StopIteration:
                if self._docs_this_pass == 0 and self._pass_from_start:
                    raise UserError(
                        f"{self.name} gives no documents to data-parallel rank {self.dp_rank} of "
                        f"{self.dp_world_size}; use more data or fewer data-parallel ranks"
                    ) from None
                if not self.infinite:
                    raise _Exhausted from None
                self._epoch += 1
                self._it, self._hf_state = None, None
                self._docs_this_pass, self._pass_from_start = 0, True
                logger.warning(
                    f"{self.name}: dp rank {self.dp_rank} reached the end of its data; starting epoch {self._epoch}"
                )
                continue
            if self.text_field not in row:
                raise UserError(
                    f"data.text_field '{self.text_field}' is not a column of {self.name}; columns are {', '.join(row)}"
                )
            text = row[self.text_field]
            if not isinstance(text, str):
                if text is None:
                    continue
                raise UserError(
                    f"data.text_field '{self.text_field}' of {self.name} holds {type(text).__name__}, not text"
                )
            if text:  # empty rows (blank lines of a .txt) would only add BOS/EOS pairs
                self._docs_this_pass += 1
                return self.tokenizer.encode(text, bos=True, eos=True)

    def _next_window(self) -> list[int]:
        n = self.seq_len + 1
        while len(self._buffer) < n:
            self._buffer.extend(self._next_tokens())
        window = self._buffer[:n]
        del self._buffer[:n]
        return window

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            try:
                w = torch.tensor([self._next_window() for _ in range(self.batch_size)], dtype=torch.int64)
            except _Exhausted:
                return  # only with infinite=False: a partial last batch is dropped
            yield w[:, :-1].contiguous(), w[:, 1:].contiguous()

    # -- checkpointing -------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Plain Python values only (ints, strs, lists, dicts): store one per data-parallel rank."""
        return {
            "hf": self.ds.state_dict() if self._it is not None else self._hf_state,
            "buffer": list(self._buffer),
            "epoch": self._epoch,
            "dp_rank": self.dp_rank,
            "dp_world_size": self.dp_world_size,
        }

    def load_state_dict(self, sd: dict) -> None:
        if (sd["dp_rank"], sd["dp_world_size"]) != (self.dp_rank, self.dp_world_size):
            raise UserError(
                f"data loader state was saved by data-parallel rank {sd['dp_rank']} of {sd['dp_world_size']} but is "
                f"loaded by rank {self.dp_rank} of {self.dp_world_size}; resume with the same data-parallel degree"
            )
        self._buffer = list(sd["buffer"])
        self._epoch = sd["epoch"]
        self._hf_state = sd["hf"]
        # HF applies this starting state at the next iter() whose epoch matches the one recorded in it.
        self.ds.load_state_dict(sd["hf"])
        self._it = None
        self._docs_this_pass, self._pass_from_start = 0, sd["hf"] is None


def build_dataloader(
    dataset: str,
    dataset_path: str | None,
    text_field: str,
    tokenizer: Tokenizer,
    dp_rank: int,
    dp_world_size: int,
    batch_size: int,
    seq_len: int,
    split: str = "train",
    infinite: bool = True,
) -> TextDataLoader:
    """The trainer's data: yields ([batch_size, seq_len], [batch_size, seq_len]) int64 CPU tensors forever."""
    hf, where = _open_source(dataset, dataset_path, split)
    if dataset_path or dataset == "debug_corpus":  # local files: checking the column costs one read
        _check_text_field(hf, text_field, where)
    return TextDataLoader(
        hf, tokenizer, text_field, dp_rank, dp_world_size, batch_size, seq_len, infinite, name=where
    )


def check_vocab(tokenizer: Tokenizer, model_vocab_size: int, tokenizer_path: str) -> None:
    """The embedding must have exactly one row per token id the tokenizer can produce."""
    if tokenizer.vocab_size != model_vocab_size:
        raise UserError(
            f"tokenizer {tokenizer_path} has {tokenizer.vocab_size} tokens but the model's vocab_size is "
            f"{model_vocab_size}; set --model.vocab_size={tokenizer.vocab_size} or use a tokenizer with "
            f"{model_vocab_size} tokens"
        )
