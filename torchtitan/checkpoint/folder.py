"""The checkpoint folder: which checkpoint a run loads, which ones it keeps, and whether they fit on the disk.

<job.dump_folder>/<checkpoint.folder>/step-<N>/        committed (it holds COMMITTED.json)
                                      step-<N>.tmp-<id>/  a save in progress or a crashed one
                                      step-<N>.deleting-<id>/  being deleted
"""

from __future__ import annotations

import os
import shutil
import uuid

from torchtitan.checkpoint.integrity import committed_checkpoints, file_size, read_marker
from torchtitan.disk import fmt_bytes, free_bytes
from torchtitan.errors import UserError


def checkpoint_to_load(cfg) -> tuple[str, bool] | None:
    """(the checkpoint this run loads, whether it is checkpoint.initial_load_path), or None for a fresh start:
    checkpoint.load_step, else the newest committed full or seed checkpoint, else initial_load_path."""
    c = cfg.checkpoint
    if c.enable:
        folder = os.path.join(cfg.job.dump_folder, c.folder)
        found = committed_checkpoints(folder)
        if c.load_step >= 0:
            if c.load_step not in found:
                have = ", ".join(str(s) for s in sorted(found)) or "none"
                raise UserError(
                    f"checkpoint.load_step={c.load_step}: no committed step-{c.load_step} in {folder};"
                    f" committed steps: {have}"
                )
            return found[c.load_step], False
        for s in sorted(found, reverse=True):
            if read_marker(found[s])["kind"] in ("full", "seed"):
                return found[s], False
    return (c.initial_load_path, True) if c.initial_load_path else None


def last_good(folder: str) -> tuple[int, str] | None:
    """(step, path) of the newest committed checkpoint a run can resume from, if any."""
    for s, path in sorted(committed_checkpoints(folder).items(), reverse=True):
        try:
            if read_marker(path).get("kind") in ("full", "seed"):
                return s, path
        except UserError:
            continue
    return None


def delete(path: str) -> None:
    # Rename first (atomic) so a crash in the middle of rmtree never leaves a half-deleted "committed" folder.
    doomed = f"{path}.deleting-{uuid.uuid4().hex[:8]}"
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def clean_up(folder: str, keep_latest_k: int, in_flight: str | None, loaded: str | None) -> None:
    """Rank 0, right after a commit: drop leftovers of crashed saves (not `in_flight`, the folder of an async save
    still being written) and all full checkpoints but the newest keep_latest_k (never `loaded`, the one this run
    resumed from)."""
    for name in os.listdir(folder):
        if (".tmp-" in name or ".deleting-" in name) and (
            in_flight is None or os.path.join(folder, name) != in_flight
        ):
            shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
    if keep_latest_k > 0:
        full = {s: p for s, p in committed_checkpoints(folder).items() if read_marker(p)["kind"] == "full"}
        for s in sorted(full)[:-keep_latest_k]:
            if os.path.abspath(full[s]) != os.path.abspath(loaded or ""):
                delete(full[s])


def space_warning(cfg, num_params: int) -> str | None:
    """A warning when the checkpoint folder has less free space than the checkpoints this run keeps need:
    keep_latest_k + 1 (those kept plus the one being written; every save of the run when keep_latest_k = 0),
    less the committed ones already there. A checkpoint's size is the newest one's, else 12 bytes per parameter
    (fp32 weights and AdamW's two fp32 moments)."""
    c, t = cfg.checkpoint, cfg.training
    if not c.enable:
        return None
    folder = os.path.join(cfg.job.dump_folder, c.folder)
    free = free_bytes(folder)
    if free is None:
        return None
    sizes = []  # of the committed full checkpoints, newest first
    for _, path in sorted(committed_checkpoints(folder).items(), reverse=True):
        try:
            marker = read_marker(path)
        except UserError:
            continue
        if marker.get("kind") == "full":
            sizes.append(sum(file_size(e) for e in marker.get("files", {}).values()))
    each = sizes[0] if sizes else 12 * num_params
    k = c.keep_latest_k
    count = k + 1 if k > 0 else -(-t.steps // c.interval)
    need = max(each, count * each - sum(sizes[:k] if k > 0 else sizes))
    if free >= need:
        return None
    kept = (
        f"checkpoint.keep_latest_k={k} kept + 1 being written" if k > 0 else f"all {count} saves of the run"
    )
    return (
        f"checkpoint folder {folder} has {fmt_bytes(free)} free, less than the ~{fmt_bytes(need)} its checkpoints"
        f" need ({count} of ~{fmt_bytes(each)}: {kept}, less those already there); a save may fail with a full"
        " disk: free space or set a lower checkpoint.keep_latest_k"
    )
