"""Text source -> tokens -> packed (input, label) windows, from disjoint shards of the documents.

    documents (HF datasets, streaming)  --split_dataset_by_node-->  K shards (disjoint documents)
      -> per shard: [BOS] + tokens + [EOS] per document, concatenated into one token stream
      -> consecutive windows of seq_len + 1 tokens; input = w[:-1], label = w[1:]
      -> a batch: batch_size / (K / dp) consecutive windows from each shard this rank owns, stacked into
         [batch_size, seq_len] int64 tensors

K = data.num_shards, or the data-parallel degree when unset (one shard per rank). Rank r owns the contiguous
shards [r * K/dp, (r + 1) * K/dp), so with a fixed K the global batch (all ranks' batches in rank order) is the
same for every data-parallel degree dividing K: loss parity across layouts and resume across degrees.

Packing wastes no tokens on padding; attention is not masked at document boundaries (as in Llama 3 pre-training
at this scale; BOS tells the model a new document started). The one token where two windows meet is the last
label of one window and is never an input, the usual price of non-overlapping windows.

Resume is exact: each shard's state is the HF dataset's own position (documents already pulled) plus our
leftover token buffer and epoch, taken between batches; loading it reproduces the very next batch.
"""

from __future__ import annotations

import copy
import glob
import logging
import os
import time
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


def _list_files(p: Path, spec: str, key: str = "data") -> list[str]:
    """Every file under folder `p`, sorted; a folder that cannot be read is an error, not silently skipped."""

    def fail(e: OSError):
        raise UserError(f"{key}.dataset_path {spec}: cannot read folder {e.filename}: {e.strerror}")

    found = []
    for d, dirs, names in os.walk(p, onerror=fail):
        dirs[:] = sorted(n for n in dirs if not n.startswith("."))
        found += [os.path.join(d, n) for n in names if not n.startswith(".")]
    return sorted(found)


def _load_files(spec: str, key: str = "data"):
    """(HF dataset, files): a file, a glob or a folder of .json/.jsonl/.parquet/.txt files, streamed by the
    matching builder. `files` is (builder, [paths]), kept to name the file behind a read error. `key`: the
    config section whose dataset_path this is (data or validation), named in errors."""
    from datasets import load_dataset

    # The builders log a read failure as an ERROR line before raising it; read_error reports it (one line that
    # names the file), so theirs would only be a second, vaguer line.
    logging.getLogger("datasets.packaged_modules").setLevel(logging.CRITICAL)
    p = Path(spec).expanduser()
    if any(ch in spec for ch in "*?["):
        candidates = sorted(glob.glob(str(p), recursive=True))
    elif p.is_dir():
        candidates = _list_files(p, spec, key)
    elif p.is_file():
        candidates = [str(p)]
    else:
        raise UserError(
            f"{key}.dataset_path {spec} does not exist; expected a {_FILE_TYPES} file, a glob or a folder"
        )
    files = [f for f in candidates if Path(f).is_file() and _builder_for(f)]
    if not files:
        raise UserError(f"{key}.dataset_path {spec} matches no {_FILE_TYPES} files")
    builders = {_builder_for(f) for f in files}
    if len(builders) > 1:
        raise UserError(
            f"{key}.dataset_path {spec} mixes file types ({', '.join(sorted(builders))}); use one type"
        )
    builder = builders.pop()
    # A user's files are one split: everything found is read, whatever split was asked for.
    try:
        return load_dataset(builder, data_files=files, split="train", streaming=True), (builder, files)
    except StopIteration:  # datasets' schema inference reads the first record; an empty file has none
        raise UserError(f"{key}.dataset_path {spec} holds no records (empty file?)") from None
    except UserError:
        raise
    except Exception as e:  # parquet's schema is read here: a corrupt file fails before any row
        raise read_error(e, f"{key}.dataset_path {spec}", (builder, files)) from None


# ------------------------------------------------------------------------------------------------ read errors

_PROBE_SECONDS = 60.0  # how long a read error may spend finding its file by reading the files one by one


def _short(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:200]


def _tracked_files(hf_dataset) -> list[str]:
    """Files the datasets library says it is reading (its own error reports use the same record)."""
    try:
        from datasets.utils.track import TrackedIterableFromGenerator

        out = []
        for v in getattr(hf_dataset._ex_iterable, "kwargs", {}).values():
            for it in v if isinstance(v, list) else [v]:
                if isinstance(it, TrackedIterableFromGenerator) and it.last_item is not None:
                    out.append(str(it.last_item))
        return out
    except Exception:  # private structure of datasets: only a shortcut, the probe below does not need it
        return []


def _probe(builder: str, path: str) -> BaseException | None:
    """Read one file alone with the same builder; its error, or None."""
    from datasets import load_dataset

    try:
        for _ in load_dataset(builder, data_files=[path], split="train", streaming=True):
            pass
    except Exception as e:
        return e
    return None


def read_error(e: BaseException, where: str, files, hf_dataset=None) -> UserError:
    """One line naming the file behind an exception raised while reading a data source.

    The exceptions of pyarrow, gzip, zstd etc. do not name the file, so: an OSError's own filename, else the
    file the datasets library was reading (if it is one of ours and fails alone), else each file read alone in
    order (for at most _PROBE_SECONDS; this is the error path) until one fails.
    """
    if isinstance(e, OSError) and e.filename:
        return UserError(f"{where}: cannot read {e.filename}: {e.strerror or _short(e)}")
    if files is None:
        return UserError(f"{where} could not be read: {_short(e)}")
    builder, paths = files
    tracked = [f for f in _tracked_files(hf_dataset) if f in paths] if hf_dataset is not None else []
    deadline = time.monotonic() + _PROBE_SECONDS
    for path in dict.fromkeys(tracked + paths):
        if time.monotonic() > deadline:
            break
        err = _probe(builder, path)
        if err is not None:
            return UserError(f"{where}: {_bad_file(path, err)}")
    return UserError(f"{where} could not be read ({_short(e)}); one of its {len(paths)} files is damaged")


def _bad_file(path: str, err: BaseException) -> str:
    name, comp = path.lower(), ""
    for c in _COMPRESSION:
        if name.endswith(c):
            name, comp = name.removesuffix(c), c
    kind = {"json": "JSON lines", "parquet": "Parquet", "text": "UTF-8 text"}[_builder_for(name)]
    if comp and "not supported" in str(err):
        return (
            f"{path} is {comp}-compressed but this Python cannot decompress {comp} ({_short(err)}); install the"
            " codec (e.g. pip install zstandard for .zst) or decompress the file"
        )
    if comp:
        return (
            f"{path} is not valid {kind} compressed as {comp} ({_short(err)}); fix, re-compress or remove it"
        )
    return f"{path} is not valid {kind} ({_short(err)}); fix or remove it"


def _load_c4(split: str, key: str = "data"):
    from datasets import load_dataset

    try:
        return load_dataset("allenai/c4", name="en", split=split, streaming=True)
    except Exception as e:  # hub failures come in many types (offline, DNS, auth, missing split)
        raise UserError(
            f"{key}.dataset=c4 could not be opened from the Hugging Face Hub (allenai/c4, split {split}): "
            f"{str(e).splitlines()[0][:160]}; check the network, or use {key}.dataset=debug_corpus or"
            f" {key}.dataset_path"
        ) from None


def _load_debug_corpus(split: str, key: str = "data"):
    path = DEBUG_CORPUS_DIR / f"{split}.jsonl"
    if not path.is_file():
        where = "split" if split == "train" else "validation.split"  # training always reads train
        raise UserError(
            f"debug_corpus {where} '{split}' not found at {path}; splits are train, validation "
            "(regenerate with python scripts/make_assets.py)"
        )
    return _load_files(str(path), key)


# Built-in sources: name -> ((split, key) -> HF IterableDataset, or (dataset, (builder, files)) for local files, so
# that a read error can name its file; key = the config section asking, named in errors). Each yields dicts with a
# "text" field.
DATASETS: dict[str, Callable] = {"c4": _load_c4, "debug_corpus": _load_debug_corpus}


# torchtitan's dataset names (its llama3 configs use them) and what they are here.
_TORCHTITAN_NAMES = {
    "c4_validation": "dataset c4 with split validation",
    "c4_test": "debug_corpus (ours, offline), or dataset_path = <torchtitan>/tests/assets/c4_test for the same"
    " documents",
    "c4_mini": "debug_corpus (ours, offline)",
}


def _open_source(dataset: str, dataset_path: str | None, split: str, key: str = "data"):
    """(HF dataset, (builder, files) of local files or None, the source's name for messages).

    key: the config section the source comes from ("data" or "validation"), named in every error."""
    if dataset_path:  # the user's files replace the named source's location
        return *_load_files(dataset_path, key), f"{key}.dataset_path {dataset_path}"
    if dataset not in DATASETS:
        known = _TORCHTITAN_NAMES.get(dataset)
        hint = f" ({dataset} is torchtitan's name; here: {known})" if known else ""
        raise UserError(
            f"{key}.dataset '{dataset}' is unknown{hint}; built-in sources are {', '.join(sorted(DATASETS))}, "
            f"or set {key}.dataset_path to your own files"
        )
    found = DATASETS[dataset](split, key)
    ds, files = found if isinstance(found, tuple) else (found, None)
    return ds, files, f"{key}.dataset {dataset}"


def validation_source(cfg) -> tuple[str, str | None, str]:
    """The held-out source as (dataset, dataset_path, key): validation.dataset / validation.dataset_path, falling
    back to data.dataset; `key` is the config section its errors name (validation when either is set, else data)."""
    v = cfg.validation
    key = "validation" if v.dataset or v.dataset_path else "data"
    return v.dataset or cfg.data.dataset, v.dataset_path, key


def _check_text_field(ds, text_field: str, where: str, files=None) -> None:
    columns = ds.column_names  # known up front for parquet; json/text only reveal it on the first row
    if columns is None:
        try:
            first = next(iter(ds), None)
        except Exception as e:
            raise read_error(e, where, files, ds) from None
        if first is None:
            raise UserError(f"{where} contains no rows")
        columns = list(first)
    if text_field not in columns:
        raise UserError(
            f"data.text_field '{text_field}' is not a column of {where}; columns are {', '.join(columns)}"
        )


class _Exhausted(Exception):
    pass


class _Shard:
    """One packed token stream: shard `index` of `count` of the documents, with its own exact position.

    `label` names the shard in messages ("data-parallel rank 1 of 2" or "shard 3 of 8 (data.num_shards)").
    """

    def __init__(self, hf_dataset, index: int, count: int, loader: TextDataLoader, label: str, fix: str):
        from datasets.distributed import split_dataset_by_node

        # One source file -> every shard reads it and keeps 1 document in `count`; with a multiple of `count`
        # files, whole files are assigned to shards. Either way the shards' documents are disjoint.
        self.ds = split_dataset_by_node(hf_dataset, rank=index, world_size=count)
        self.loader, self.label, self.fix = loader, label, fix

        self.buffer: list[int] = []  # tokens of documents already pulled, not yet emitted
        self.epoch = 0
        self.it: Iterator | None = None  # live iterator over self.ds; None until the next document is needed
        self.hf_state: dict | None = None  # position to report while self.it is None
        self.docs_this_pass = 0  # non-empty documents read since the source (re)started
        self.pass_from_start = True

    def _next_tokens(self) -> list[int]:
        """Tokens of the next document of this shard, framed by BOS/EOS. Restarts the source at its end."""
        dl = self.loader
        while True:
            if self.it is None:
                self.ds.set_epoch(self.epoch)  # the HF state records its epoch; a later epoch starts fresh
                self.it = iter(self.ds)
            try:
                row = next(self.it)
            except StopIteration:
                if self.docs_this_pass == 0 and self.pass_from_start:
                    raise UserError(
                        f"{dl.name} gives no non-empty '{dl.text_field}' documents (zero tokens) to {self.label};"
                        f" {self.fix}"
                    ) from None
                if not dl.infinite:
                    raise _Exhausted from None
                self.epoch += 1
                self.it, self.hf_state = None, None
                self.docs_this_pass, self.pass_from_start = 0, True
                logger.warning(
                    f"{dl.name}: {self.label} reached the end of its data; starting epoch {self.epoch}"
                )
                continue
            except UserError:
                raise
            except (
                Exception
            ) as e:  # a corrupt file anywhere in the source: one line naming it, not a traceback
                raise read_error(e, dl.name, dl.files, self.ds) from None
            if dl.text_field not in row:
                raise UserError(
                    f"data.text_field '{dl.text_field}' is not a column of {dl.name}; columns are {', '.join(row)}"
                )
            text = row[dl.text_field]
            if not isinstance(text, str):
                if text is None:
                    continue
                raise UserError(
                    f"data.text_field '{dl.text_field}' of {dl.name} holds {type(text).__name__}, not text"
                )
            if text:  # empty rows (blank lines of a .txt) would only add BOS/EOS pairs
                self.docs_this_pass += 1
                return dl.tokenizer.encode(text, bos=True, eos=True)

    def next_window(self) -> list[int]:
        n = self.loader.seq_len + 1
        while len(self.buffer) < n:
            self.buffer.extend(self._next_tokens())
        window = self.buffer[:n]
        del self.buffer[:n]
        return window

    def state_dict(self) -> dict:
        return {
            "hf": self.ds.state_dict() if self.it is not None else self.hf_state,
            "buffer": list(self.buffer),
            "epoch": self.epoch,
        }

    def load_state_dict(self, sd: dict) -> None:
        self.buffer = list(sd["buffer"])
        self.epoch = sd["epoch"]
        self.hf_state = copy.deepcopy(sd["hf"])  # HF keeps a reference to what it is given; a copy stays ours
        # HF applies this starting state at the next iter() whose epoch matches the one recorded in it.
        self.ds.load_state_dict(copy.deepcopy(sd["hf"]))
        self.it = None
        self.docs_this_pass, self.pass_from_start = 0, sd["hf"] is None


def _check_shards(num_shards: int, dp_world_size: int, batch_size: int) -> None:
    """Virtual shards keep the global batch independent of the dp degree only when both divisions are exact."""
    if num_shards < 1:
        raise UserError(
            f"data.num_shards={num_shards} must be at least 1 (or unset: one per data-parallel rank)"
        )
    if num_shards % dp_world_size:
        raise UserError(
            f"data.num_shards={num_shards} is not a multiple of the data-parallel degree {dp_world_size}; "
            f"use a multiple of {dp_world_size} (e.g. {dp_world_size * batch_size}) or leave data.num_shards unset"
        )
    per_rank = num_shards // dp_world_size
    if batch_size % per_rank:
        valid = [dp_world_size * d for d in range(1, batch_size + 1) if batch_size % d == 0]
        raise UserError(
            f"data.num_shards={num_shards} at data-parallel degree {dp_world_size} gives {per_rank} shards per rank, "
            f"which does not divide the local batch size {batch_size} (each shard fills an equal part of it); "
            f"use data.num_shards in {valid} or a training.local_batch_size that is a multiple of {per_rank}"
        )


class TextDataLoader:
    """Iterable over (inputs, labels) batches for one data-parallel rank, with exact state_dict/load_state_dict.

    The documents are split into `num_shards` disjoint shards, each its own packed token stream; this rank owns
    the contiguous shards [dp_rank * S, (dp_rank + 1) * S) with S = num_shards / dp_world_size, and a batch
    takes batch_size / S consecutive windows from each of them, shard by shard. So the concatenation of all
    ranks' batches (the global batch) depends on num_shards, not on the data-parallel degree. num_shards=None
    means one shard per rank (the cheapest: each rank opens its source once).

    Iterating continues from the current position (it does not restart), so `iter()` may be called again after
    load_state_dict. With infinite=True (default) each shard restarts at its end, logging the new epoch number.
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
        num_shards: int | None = None,
        files=None,
    ):
        if not 0 <= dp_rank < dp_world_size:
            raise ValueError(f"dp_rank {dp_rank} outside [0, {dp_world_size})")
        self.tokenizer, self.text_field, self.name = tokenizer, text_field, name
        self.files = files  # (builder, paths) of local files, to name the one behind a read error
        self.dp_rank, self.dp_world_size = dp_rank, dp_world_size
        self.batch_size, self.seq_len, self.infinite = batch_size, seq_len, infinite
        self.virtual = num_shards is not None
        self.num_shards = num_shards if self.virtual else dp_world_size
        _check_shards(self.num_shards, dp_world_size, batch_size)
        per_rank = self.num_shards // dp_world_size
        self.rows_per_shard = batch_size // per_rank
        self.shards: dict[int, _Shard] = {}
        for k in range(dp_rank * per_rank, (dp_rank + 1) * per_rank):
            if self.virtual:
                label = f"shard {k} of {self.num_shards} (data.num_shards)"
                fix = "use more data or a smaller data.num_shards"
            else:
                label = f"data-parallel rank {dp_rank} of {dp_world_size}"
                fix = "use more data or fewer data-parallel ranks"
            self.shards[k] = _Shard(hf_dataset, k, self.num_shards, self, label, fix)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            try:
                rows = [s.next_window() for s in self.shards.values() for _ in range(self.rows_per_shard)]
            except _Exhausted:
                return  # only with infinite=False: a partial last batch is dropped
            w = torch.tensor(rows, dtype=torch.int64)
            yield w[:, :-1].contiguous(), w[:, 1:].contiguous()

    # -- checkpointing -------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """JSON-serializable: {"num_shards": K, "shards": {"k": state}} for this rank's shards, taken between batches.

        The "shards" of all ranks may be merged into one dict: any rank of any data-parallel degree can then
        load it, which makes resuming with another degree exact as long as data.num_shards stays the same.
        """
        return {
            "num_shards": self.num_shards,
            "shards": {str(k): s.state_dict() for k, s in self.shards.items()},
        }

    def load_state_dict(self, sd: dict) -> None:
        """Takes the states of (at least) this rank's shards; states of other shards are ignored."""
        how = (
            "keep data.num_shards the same to resume exactly"
            if self.virtual
            else "resume with the same data-parallel degree, or set data.num_shards in both runs to resume "
            "across degrees"
        )
        if sd["num_shards"] != self.num_shards:
            saved = f"{sd['num_shards']} shards"
            now = f"{self.num_shards} ({'data.num_shards' if self.virtual else 'one per data-parallel rank'})"
            raise UserError(f"data loader state has {saved} but this run uses {now}; {how}")
        missing = [str(k) for k in self.shards if str(k) not in sd["shards"]]
        if missing:
            raise UserError(
                f"data loader state lacks shard(s) {', '.join(missing)} of {self.num_shards}, needed by "
                f"data-parallel rank {self.dp_rank} of {self.dp_world_size}; it holds {', '.join(sd['shards'])}: "
                "merge the states of all saving ranks"
            )
        for k, s in self.shards.items():
            s.load_state_dict(sd["shards"][str(k)])


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
    num_shards: int | None = None,
    key: str = "data",
) -> TextDataLoader:
    """The trainer's data: yields ([batch_size, seq_len], [batch_size, seq_len]) int64 CPU tensors forever.

    num_shards (data.num_shards): split the documents into this many virtual shards so that the global batch is
    the same for every data-parallel degree dividing it; None = one shard per data-parallel rank.
    """
    hf, files, where = _open_source(dataset, dataset_path, split, key)
    if files is not None:  # local files: checking the column costs one read
        _check_text_field(hf, text_field, where, files)
    return TextDataLoader(
        hf,
        tokenizer,
        text_field,
        dp_rank,
        dp_world_size,
        batch_size,
        seq_len,
        infinite,
        where,
        num_shards,
        files,
    )


def check_vocab(
    tokenizer: Tokenizer, model_vocab_size: int, tokenizer_path: str, model_config: str | None = None
) -> None:
    """The embedding must have exactly one row per token id the tokenizer can produce. `model_config`: the file
    the model's shape was read from (a checkpoint's config.json), when it is not the job config."""
    if tokenizer.vocab_size == model_vocab_size:
        return
    if model_config is not None:  # the shape is the checkpoint's: only the tokenizer can change
        raise UserError(
            f"{model_config} has vocab_size {model_vocab_size} but tokenizer {tokenizer_path} has"
            f" {tokenizer.vocab_size} tokens: set --model.tokenizer_path to the tokenizer the checkpoint was"
            " trained with"
        )
    raise UserError(
        f"tokenizer {tokenizer_path} has {tokenizer.vocab_size} tokens but the model's vocab_size is "
        f"{model_vocab_size}; set --model.vocab_size={tokenizer.vocab_size} or use a tokenizer with "
        f"{model_vocab_size} tokens"
    )
