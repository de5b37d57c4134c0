"""The commit marker (COMMITTED.json) and the checks a checkpoint passes before any of it is read.

A save writes its files into a temporary folder; rank 0 then writes the marker, listing every file with its size
and content checksum (torchtitan/checkpoint/checksums.py computes them as the bytes are written), and renames the
folder to `step-N`. Only `step-N` folders holding a marker count as committed. A load checks the listed sizes
(always) and checksums (checkpoint.verify_on_load, the files shared out over the ranks) first, so a truncated or
corrupt file is one line naming it, with the older committed steps to resume from instead.
"""

from __future__ import annotations

import json
import os
import re
import time

import torch.distributed as dist

from torchtitan.checkpoint.checksums import ALGORITHMS, DEFAULT_ALGORITHM, bytes_checksum, file_checksum
from torchtitan.disk import fmt_bytes
from torchtitan.errors import UserError
from torchtitan.log import logger

MARKER = "COMMITTED.json"
_COMMITTED = re.compile(r"step-(\d+)")


def write_json(path: str, obj) -> tuple[int, str]:
    """Write `obj` as JSON, atomically; returns (size, checksum) of the bytes written."""
    data = json.dumps(obj).encode("utf-8")
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return len(data), bytes_checksum(data)


def read_json(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise UserError(f"checkpoint file {path} is missing; the checkpoint is incomplete") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(
            f"checkpoint file {path} is corrupt ({e}); pick another checkpoint.load_step"
        ) from None


def read_marker(path: str) -> dict:
    """The marker of checkpoint folder `path`."""
    return read_json(os.path.join(path, MARKER))


def write_marker(path: str, marker: dict, checksums: dict | None = None) -> None:
    """Write COMMITTED.json into checkpoint folder `path`, listing every file in it with its size and checksum.

    `checksums` ({relative path: (size, checksum)}) are those computed while the files were written; a file
    without one (or whose size changed since) is hashed here by reading it (small files only, in practice).
    """
    marker = dict(marker, checksum=DEFAULT_ALGORITHM)
    checksums = checksums or {}
    files = {}
    for d, _, names in os.walk(path):
        for name in names:
            if name == MARKER:
                continue
            f = os.path.join(d, name)
            rel, size = os.path.relpath(f, path), os.path.getsize(f)
            known = checksums.get(rel)
            digest = known[1] if known is not None and known[0] == size else file_checksum(f)
            files[rel] = {"size": size, "checksum": digest}
    marker["files"] = dict(sorted(files.items()))
    write_json(os.path.join(path, MARKER), marker)


def committed_checkpoints(folder: str) -> dict[int, str]:
    """{step: path} of the committed checkpoints in `folder`: a `step-<N>` folder holding the marker."""
    found = {}
    if os.path.isdir(folder):
        for name in os.listdir(folder):
            m = _COMMITTED.fullmatch(name)
            if m and os.path.isfile(os.path.join(folder, name, MARKER)):
                found[int(m.group(1))] = os.path.join(folder, name)
    return found


def file_size(entry) -> int:
    return entry["size"] if isinstance(entry, dict) else entry  # markers written before checksums: sizes only


def verify_checkpoint(path: str, checksums: bool = False) -> dict:
    """Check a checkpoint against its marker before reading it: every listed file present with its size and, with
    `checksums`, its content checksum (a full read; CheckpointManager.load shares that out over the ranks).

    Returns the marker. Raises a one-line UserError naming the first bad file. A folder without a marker but with
    DCP's .metadata (written by another tool) is accepted as a model-only checkpoint.
    """
    if not os.path.isdir(path):
        raise UserError(f"checkpoint folder {path} does not exist")
    marker_path = os.path.join(path, MARKER)
    if not os.path.exists(marker_path):
        if os.path.exists(os.path.join(path, ".metadata")):
            return {"kind": "export", "step": 0, "files": {}}
        raise UserError(f"{path} is not a checkpoint: it has neither {MARKER} nor .metadata")
    marker = read_json(marker_path)
    for rel, entry in marker.get("files", {}).items():
        f = os.path.join(path, rel)
        if not os.path.exists(f):
            raise UserError(f"checkpoint file {f} is missing; the checkpoint is incomplete")
        actual, size = os.path.getsize(f), file_size(entry)
        if actual != size:
            raise UserError(f"checkpoint file {f} has {actual} bytes, expected {size}: truncated or modified")
    if checksums:
        bad = checksum_mismatch(path, marker, list(marker.get("files", {})))
        if bad is not None:
            raise UserError(bad)
    return marker


def checksum_mismatch(path: str, marker: dict, files: list[str]) -> str | None:
    """Hash `files` (relative to `path`) and compare with the marker: the first mismatch as a one-line message."""
    algorithm = marker.get("checksum")
    if algorithm is None:
        return None  # written before checksums existed: sizes were checked, content cannot be
    if algorithm not in ALGORITHMS:
        logger.warning(
            f"checkpoint {path}: its {algorithm} checksums cannot be computed here (pip install xxhash); "
            "content not verified"
        )
        return None
    for rel in files:
        expected = marker["files"][rel]["checksum"]
        found = file_checksum(os.path.join(path, rel), algorithm)
        if found != expected:
            return (
                f"checkpoint file {os.path.join(path, rel)} of step {marker.get('step', 0)} is corrupt: {algorithm}"
                f" checksum {found}, expected {expected} (recorded when it was written); {_older(path, marker)}"
            )
    return None


def _older(path: str, marker: dict) -> str:
    """Advice after a bad checkpoint: the committed steps older than this one."""
    folder, step = os.path.dirname(os.path.abspath(path)), marker.get("step", 0)
    older = sorted(s for s in committed_checkpoints(folder) if s < step)
    if older:
        return (
            f"resume from an older checkpoint with --checkpoint.load_step={older[-1]}"
            f" (committed older steps: {', '.join(map(str, older))})"
        )
    return (
        f"there is no older committed checkpoint in {folder}: restore the file from a copy or start a new run"
    )


def _share(files: dict, rank: int, world: int) -> list[str]:
    """This rank's part of `files` ({name: marker entry}) for verifying: largest first to the least loaded rank."""
    load, mine = [0] * world, []
    for rel in sorted(files, key=lambda r: (-file_size(files[r]), r)):
        r = min(range(world), key=lambda i: load[i])
        load[r] += file_size(files[rel])
        if r == rank:
            mine.append(rel)
    return mine


def verify_content(path: str, marker: dict, rank: int, world_size: int) -> None:
    """All ranks: checksums of every file against the marker, the files shared out over the ranks (one full read
    of the checkpoint in all); the first mismatch any rank finds is raised on every rank."""
    files = marker.get("files", {})
    if not files or marker.get("checksum") is None:
        return
    t = time.perf_counter()
    mine = _share(files, rank, world_size)
    found = [None] * world_size
    dist.all_gather_object(found, checksum_mismatch(path, marker, mine))
    bad = next((f for f in found if f), None)
    if bad is not None:
        raise UserError(bad)
    size = sum(file_size(e) for e in files.values())
    logger.info(
        f"checkpoint {path}: {len(files)} files ({fmt_bytes(size)}) match their {marker['checksum']} checksums,"
        f" verified by {world_size} rank(s) in {time.perf_counter() - t:.3f} s (checkpoint.verify_on_load)"
    )
