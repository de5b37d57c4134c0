"""Content checksums of checkpoint files, computed while the bytes are written.

A checkpoint's marker (COMMITTED.json) lists every file with its size and a content checksum, so a flipped bit or
a truncated-then-padded copy is caught before any weight is loaded. The checksum is xxh3_64 (xxhash, which the
`datasets` dependency installs; several GB/s per core) or, without xxhash, zlib's crc32; the marker names the
algorithm it used.

Large files are hashed while they are written: `ChecksumWriter` is DCP's FileSystemWriter with its file system
replaced by one whose write streams feed every byte to the hash as it passes, so no file is read back. Each rank
returns its files' checksums to the coordinator through DCP's own gather of write results (as extra entries that
`finish` strips before the `.metadata` index is written), so rank 0 has every rank's checksums when it writes
the marker, without another collective.
"""

from __future__ import annotations

import os
import zlib
from contextlib import contextmanager
from pathlib import Path

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

try:
    import xxhash
except (
    ImportError
):  # pragma: no cover - datasets depends on xxhash; crc32 keeps checkpoints verifiable without it
    xxhash = None

_CHUNK = 16 * 2**20
_RESULT_PREFIX = "__torchtitan_checksum__/"  # fqn of the extra write results that carry a file's checksum


class _Crc32:
    def __init__(self):
        self.value = 0

    def update(self, data) -> None:
        self.value = zlib.crc32(data, self.value)

    def hexdigest(self) -> str:
        return f"{self.value:08x}"


ALGORITHMS = {"crc32": _Crc32}
if xxhash is not None:
    ALGORITHMS["xxh3_64"] = xxhash.xxh3_64
DEFAULT_ALGORITHM = "xxh3_64" if xxhash is not None else "crc32"


def new_hash(algorithm: str):
    return ALGORITHMS[algorithm]()


def bytes_checksum(data, algorithm: str = DEFAULT_ALGORITHM) -> str:
    h = new_hash(algorithm)
    h.update(data)
    return h.hexdigest()


def file_checksum(path: str | os.PathLike, algorithm: str = DEFAULT_ALGORITHM) -> str:
    """Checksum of a whole file, read in 16 MiB chunks (for small files, and for verifying)."""
    h = new_hash(algorithm)
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


class _HashingStream:
    """A write stream that hashes every byte on its way to the file (DCP writes each file front to back)."""

    def __init__(self, raw, path, algorithm: str, on_first_write, errors: list):
        self.raw, self.path, self.hash, self.size, self.errors = (
            raw,
            str(path),
            new_hash(algorithm),
            0,
            errors,
        )
        self.sequential = True  # false after a seek: the hash no longer describes the file
        self._on_first_write = on_first_write

    def write(self, b) -> int:
        try:
            if self._on_first_write is not None:
                hook, self._on_first_write = self._on_first_write, None
                hook()
            n = self.raw.write(b)
        except OSError as e:  # kept: torch.save reports a failed write as a RuntimeError of its own
            e.filename = e.filename or self.path
            self.errors.append(e)
            raise
        nbytes = memoryview(b).nbytes
        if (
            n is not None and n != nbytes
        ):  # a short write (raw streams only): hash by reading the file instead
            self.sequential = False
        self.hash.update(b)
        self.size += nbytes
        return n

    def seek(self, *args):
        self.sequential = False
        return self.raw.seek(*args)

    def tell(self) -> int:
        return self.raw.tell()

    def flush(self) -> None:
        self.raw.flush()

    def fileno(self) -> int:
        return self.raw.fileno()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self.raw.seekable()

    def close(self) -> None:
        self.raw.close()


class _HashingFileSystem(FileSystem):
    """DCP's local file system whose "wb" streams hash what they write; results go to writer.written."""

    def __init__(self, writer: ChecksumWriter):
        self.writer = writer

    @contextmanager
    def create_stream(self, path, mode: str):
        if mode != "wb":
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        w = self.writer
        rel = os.path.relpath(path, w.path)
        hook = (lambda: w.on_data_write(rel)) if not rel.startswith(".metadata") else None
        try:
            with super().create_stream(path, mode) as raw:
                stream = _HashingStream(raw, path, w.algorithm, hook, w.errors)
                yield stream
        except OSError as e:  # at open or close (the last buffered bytes)
            e.filename = e.filename or str(path)
            w.errors.append(e)
            raise
        if stream.sequential:  # after a clean close only: a failed write records nothing
            w.written[rel] = (stream.size, stream.hash.hexdigest())

    def rename(self, path, new_path) -> None:
        super().rename(path, new_path)
        w = self.writer
        old = os.path.relpath(path, w.path)
        if old in w.written:
            w.written[os.path.relpath(new_path, w.path)] = w.written.pop(old)


class ChecksumWriter(FileSystemWriter):
    """FileSystemWriter that hashes its files while writing them.

    After a save, on the coordinator, `checksums` is {path relative to the checkpoint: (size, hex digest)} for
    every file any rank wrote through DCP (.distcp files and .metadata) plus the `extra_files` each rank passed
    (files it wrote itself, e.g. its train_state JSON). `before_data_file(path)`, if given, runs before the first
    byte of each data file (the manager calls torchtitan.testing.faults there).
    """

    def __init__(self, path, *, algorithm: str = DEFAULT_ALGORITHM, extra_files=None, before_data_file=None):
        super().__init__(path)
        self.algorithm, self.before_data_file = algorithm, before_data_file
        self.extra_files = dict(extra_files or {})
        self.written: dict[str, tuple[int, str]] = {}
        self.checksums: dict[str, tuple[int, str]] | None = None
        self.errors: list[OSError] = []  # this rank's failed writes, for the failure message
        self.fs = _HashingFileSystem(self)

    @property
    def error(self) -> OSError | None:
        return self.errors[0] if self.errors else None

    def on_data_write(self, rel: str) -> None:
        if self.before_data_file is not None:
            self.before_data_file(str(Path(self.path) / rel))

    def reset(self, checkpoint_id=None) -> None:
        super().reset(checkpoint_id)
        self.written.clear()

    def write_data(self, plan, planner):
        results = super().write_data(plan, planner).wait()  # the file system writer finishes before returning
        carried = {**self.written, **self.extra_files}
        results = results + [
            WriteResult(index=MetadataIndex(_RESULT_PREFIX + rel), size_in_bytes=size, storage_data=digest)
            for rel, (size, digest) in carried.items()
        ]
        fut: Future = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata, results) -> None:
        checksums, plain = {}, []
        for rank_results in results:
            plain.append([r for r in rank_results if not r.index.fqn.startswith(_RESULT_PREFIX)])
            for r in rank_results:
                if r.index.fqn.startswith(_RESULT_PREFIX):
                    checksums[r.index.fqn[len(_RESULT_PREFIX) :]] = (r.size_in_bytes, r.storage_data)
        super().finish(metadata, plain)
        checksums.update(self.written)  # .metadata, written just now by this (coordinating) rank
        self.checksums = checksums
