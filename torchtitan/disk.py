"""Where a run writes: every output path checked before anything starts, free space, disk errors in one line.

A run writes into job.dump_folder: config.toml, logs/, tb/ (metrics.enable_tensorboard), metrics.jsonl
(metrics.enable_jsonl), the checkpoint folder (checkpoint.enable) and the profiler's traces (profiling.enable_profiling).
`check_output_paths` creates each folder and writes a probe file into it, so a path that is a file, sits on a
read-only or full file system, or cannot be created fails with one line naming it, before any process group
starts (the trainer calls it first; preflight reports it as its "folders" check).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

from torchtitan.errors import UserError


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def free_bytes(path: str) -> int | None:
    """Free bytes for an unprivileged writer on the file system holding `path` (or its nearest existing parent)."""
    p = os.path.abspath(path)
    while not os.path.exists(p) and os.path.dirname(p) != p:
        p = os.path.dirname(p)
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def free_text(path: str) -> str:
    free = free_bytes(path)
    return f"{fmt_bytes(free)} free" if free is not None else "free space unknown"


def output_folders(cfg) -> list[tuple[str, str]]:
    """(what it is, folder) for every folder this run writes into, the dump folder first."""
    dump = cfg.job.dump_folder
    folders = [("job.dump_folder", dump), ("log folder", os.path.join(dump, "logs"))]
    if cfg.metrics.enable_tensorboard:
        folders.append(("TensorBoard folder", os.path.join(dump, "tb")))
    if cfg.checkpoint.enable:
        folders.append(("checkpoint folder", os.path.join(dump, cfg.checkpoint.folder)))
    if cfg.profiling.enable_profiling:
        folders.append(("profiler trace folder", os.path.join(dump, cfg.profiling.save_traces_folder)))
    return folders


def _writable_folder(what: str, folder: str) -> None:
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-") as f:
            f.write(b"x")
            f.flush()
    except OSError as e:
        blocker = _existing_non_folder(folder)
        if blocker is not None:
            raise UserError(f"{what} {folder} cannot be created: {blocker} is a file, not a folder") from None
        raise UserError(f"{what} {folder} is not writable: {e.strerror or e} ({free_text(folder)})") from None


def _existing_non_folder(folder: str) -> str | None:
    """The first component of `folder` that exists but is not a folder (e.g. dump_folder pointing at a file)."""
    p = os.path.abspath(folder)
    parts = []
    while os.path.dirname(p) != p:
        parts.append(p)
        p = os.path.dirname(p)
    for q in reversed(parts):
        if os.path.exists(q) and not os.path.isdir(q):
            return q
    return None


def _missing(folder: str) -> list[str]:
    """`folder` and its parents that do not exist yet, deepest first."""
    out, p = [], os.path.abspath(folder)
    while not os.path.exists(p) and os.path.dirname(p) != p:
        out.append(p)
        p = os.path.dirname(p)
    return out


def check_output_paths(cfg, keep: bool = True) -> str:
    """Every folder (and metrics.jsonl) the run writes: created and writable, or one UserError naming it.

    keep=False (preflight) removes again the folders the check created, so a dry run leaves nothing behind.
    """
    folders, created = output_folders(cfg), []
    try:
        for what, folder in folders:
            missing = _missing(folder)
            _writable_folder(what, folder)
            created += missing
        if cfg.metrics.enable_jsonl:
            jsonl = os.path.join(cfg.job.dump_folder, "metrics.jsonl")
            if os.path.isdir(jsonl):
                raise UserError(
                    f"metrics file {jsonl} is a folder; the run writes its metrics into that file"
                )
        dump = cfg.job.dump_folder
        return f"{len(folders)} folder(s) under {dump} writable, {free_text(dump)}"
    finally:
        if not keep:
            for d in sorted(set(created), key=len, reverse=True):
                with contextlib.suppress(OSError):
                    os.rmdir(d)
