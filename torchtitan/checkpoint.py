"""Checkpoints that lose nothing: what is saved, when, where, atomically; resume; exports; preemption.

Layout (docs/checkpointing.md):

    <job.dump_folder>/<checkpoint.folder>/
        step-200/                      a committed checkpoint (only names `step-<N>` with a marker are read)
            .metadata, __<r>_0.distcp  DCP: model weights and optimizer state, sharded, any layout can read them
            train_state/rank-<r>.json  per global rank: step, tokens seen, LR schedule, optimizer hyper-parameters,
                                       data-loader position, RNG states (plain JSON: nothing is unpickled)
            COMMITTED.json             written last: kind (full | seed | export), step, every file and its size
        step-300.tmp-<id>/             a save in progress or a crashed one: never read, deleted by a later save

A save writes into `step-N.tmp-<id>`; when every rank's data is on disk, rank 0 writes COMMITTED.json and renames
the folder to `step-N` (rename is atomic on POSIX). A process killed at any moment therefore leaves either the old
set of checkpoints or the old set plus the new one, never a half-written `step-N`.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import time
import uuid

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from torchtitan.errors import UserError
from torchtitan.log import logger

MARKER = "COMMITTED.json"
STATE_DIR = "train_state"
EXIT_PREEMPTED = 75  # EX_TEMPFAIL from sysexits.h: "temporary failure, try again" = preempted, resumable
_COMMITTED = re.compile(r"step-(\d+)")


class NonFiniteError(UserError):
    """Training produced a NaN/inf loss or gradient norm: stop (one line, exit code 3), write nothing."""

    exit_code = 3


# ------------------------------------------------------------------------------------------------ fault hooks


def fault_hook(point: str, step: int, rank: int, before=None) -> None:
    """Test hook: TORCHTITAN_TEST_FAULT="<point>:<step>[:<rank>]" SIGKILLs this process at that point.

    Only on the first attempt under torchrun (TORCHELASTIC_RESTART_COUNT 0), so a restarted job runs through.
    `before` runs first (the trainer waits for its async save there, so a test knows what was committed).
    Points: step_end (after a training step), and inside a save: save_begin, save_written (data on disk, no
    marker), save_marked (marker written, folder not yet renamed).
    """
    spec = os.environ.get("TORCHTITAN_TEST_FAULT")
    if not spec or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    parts = spec.split(":")
    if parts[0] == point and int(parts[1]) == step and (len(parts) < 3 or int(parts[2]) == rank):
        if before is not None:
            before()
        os.kill(os.getpid(), signal.SIGKILL)


def nan_hook_step() -> int:
    """Test hook: TORCHTITAN_TEST_NAN_STEP=<step> makes the trainer's loss NaN at that step (non-finite checks)."""
    return int(os.environ.get("TORCHTITAN_TEST_NAN_STEP", "0"))


# ---------------------------------------------------------------------------------------------------- signals


class PreemptionFlag:
    """SIGTERM / SIGUSR1 (what SLURM sends before preemption or the time limit) only set a flag; the trainer checks
    it after each step, saves, and exits with EXIT_PREEMPTED. A handler never saves by itself: the signal can
    arrive in the middle of a collective, and every rank must save at the same step."""

    def __init__(self):
        self.signum = 0
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        self.signum = signum


# ------------------------------------------------------------------------------------------------- small files


def _write_json(path: str, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _read_json(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise UserError(f"checkpoint file {path} is missing; the checkpoint is incomplete") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(
            f"checkpoint file {path} is corrupt ({e}); pick another checkpoint.load_step"
        ) from None


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode("ascii")


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)


def _jsonable(obj):
    """Tuples -> lists, tensors -> numbers: what the optimizer and scheduler keep in their plain state."""
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return obj.item()
    return obj


def write_marker(path: str, marker: dict) -> None:
    """Write COMMITTED.json into checkpoint folder `path`, listing every file in it with its size."""
    marker = dict(marker)
    marker["files"] = {
        os.path.relpath(os.path.join(d, f), path): os.path.getsize(os.path.join(d, f))
        for d, _, files in os.walk(path)
        for f in files
        if f != MARKER
    }
    _write_json(os.path.join(path, MARKER), marker)


def committed_checkpoints(folder: str) -> dict[int, str]:
    """{step: path} of the committed checkpoints in `folder`: a `step-<N>` folder holding the marker."""
    found = {}
    if os.path.isdir(folder):
        for name in os.listdir(folder):
            m = _COMMITTED.fullmatch(name)
            if m and os.path.isfile(os.path.join(folder, name, MARKER)):
                found[int(m.group(1))] = os.path.join(folder, name)
    return found


def verify_checkpoint(path: str) -> dict:
    """Check a checkpoint against its marker (every listed file present, with its size) before reading it.

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
    marker = _read_json(marker_path)
    for rel, size in marker.get("files", {}).items():
        f = os.path.join(path, rel)
        if not os.path.exists(f):
            raise UserError(f"checkpoint file {f} is missing; the checkpoint is incomplete")
        actual = os.path.getsize(f)
        if actual != size:
            raise UserError(f"checkpoint file {f} has {actual} bytes, expected {size}: truncated or modified")
    return marker


def _model_view(model_parts: list[nn.Module]) -> nn.Module:
    """One module whose parameter names are the full model's, over all parts this rank holds (pipeline stages
    keep the full model's names; their `layers` dicts are merged), so state dicts are layout independent."""
    if len(model_parts) == 1:
        return model_parts[0]
    view, layers = nn.Module(), nn.ModuleDict()
    for part in model_parts:
        for name, child in part.named_children():
            if name == "layers":
                layers.update(child)
            elif child is not None:
                view.add_module(name, child)
    view.add_module("layers", layers)
    return view


# ----------------------------------------------------------------------------------------------------- manager


class CheckpointManager:
    """Saves and loads everything a run needs to continue as if it had never stopped."""

    def __init__(
        self,
        cfg,
        model_parts,
        optimizer,
        scheduler,
        dataloader,
        *,
        rank: int,
        dp_rank: int,
        dp: int,
        extra_state: dict | None = None,
    ):
        self.cfg, self.c = cfg, cfg.checkpoint
        self.folder = os.path.join(cfg.job.dump_folder, self.c.folder)
        self.model = _model_view(model_parts)
        self.optimizer, self.scheduler, self.dataloader = optimizer, scheduler, dataloader
        self.rank, self.dp_rank, self.dp = rank, dp_rank, dp
        # {key: object with state_dict()/load_state_dict()} kept in each rank's train_state JSON (e.g. goodput)
        self.extra_state = extra_state or {}
        self.world_size = dist.get_world_size()
        # All ranks write into the same temporary folder, so they need the same id: rank 0 draws it.
        ids = [uuid.uuid4().hex[:8]]
        dist.broadcast_object_list(ids, src=0)
        self.save_id = ids[0]
        # An async save runs collectives in a background thread; on its own gloo group they never interleave
        # with the training step's collectives on the default group.
        self.async_pg = dist.new_group(backend="gloo") if self.c.async_mode == "async" else None
        self.pending = (
            None  # (future, tmp path, final path, marker, t_start, done time holder) of an async save
        )
        self.loaded_path: str | None = None

    # ---- what is saved ---------------------------------------------------------------------------------------

    def _dcp_state(self, model_only: bool, dtype: torch.dtype | None = None) -> dict:
        model = get_model_state_dict(self.model)
        if dtype is not None:
            model = {k: v.to(dtype) if v.is_floating_point() else v for k, v in model.items()}
        if model_only:
            return {"model": model}
        # Only the tensors of the optimizer go to DCP (sharded, reshardable); its plain hyper-parameters go to
        # the JSON file, so no Python object is ever pickled into the checkpoint.
        return {"model": model, "optimizer": get_optimizer_state_dict(self.model, self.optimizer)["state"]}

    def _train_state(self, step: int, tokens_seen: int) -> dict:
        groups = [
            {k: v for k, v in g.items() if k != "params"} for g in self.optimizer.state_dict()["param_groups"]
        ]
        sched = {k: v for k, v in self.scheduler.state_dict().items() if k != "lr_lambdas"}
        return {
            "step": step,
            "tokens_seen": tokens_seen,
            "world_size": self.world_size,
            "dp_rank": self.dp_rank,
            "dp_degree": self.dp,
            "lr_scheduler": _jsonable(sched),
            "param_groups": _jsonable(groups),
            "dataloader": self.dataloader.state_dict() if self.dataloader is not None else None,
            "rng": {
                "cpu": _b64(torch.get_rng_state()),
                "cuda": _b64(torch.cuda.get_rng_state()) if torch.cuda.is_available() else None,
            },
            **{key: obj.state_dict() for key, obj in self.extra_state.items()},
        }

    # ---- save --------------------------------------------------------------------------------------------------

    def should_save(self, step: int, last_step: int) -> bool:
        return self.c.enable and (step % self.c.interval == 0 or step == last_step)

    def save(self, step: int, tokens_seen: int, kind: str = "full") -> None:
        """Save at `step` (all ranks). kind: full (resumable), export (model only, export_dtype), seed (step 0)."""
        self.wait()  # never two saves in flight
        final = os.path.join(self.folder, f"step-{step}")
        tmp = f"{final}.tmp-{self.save_id}"
        t0 = time.perf_counter()
        fault_hook("save_begin", step, self.rank)
        os.makedirs(os.path.join(tmp, STATE_DIR), exist_ok=True)
        if kind == "full":
            _write_json(
                os.path.join(tmp, STATE_DIR, f"rank-{self.rank}.json"), self._train_state(step, tokens_seen)
            )
        dtype = (
            {"float32": torch.float32, "bfloat16": torch.bfloat16}[self.c.export_dtype]
            if kind == "export"
            else None
        )
        state = self._dcp_state(model_only=kind != "full", dtype=dtype)
        marker = {"kind": kind, "step": step, "tokens_seen": tokens_seen, "world_size": self.world_size}
        if self.c.async_mode == "async" and kind == "full":
            fut = dcp.async_save(state, checkpoint_id=tmp, process_group=self.async_pg)
            fut = getattr(fut, "upload_completion", fut)  # torch >= 2.9 may return an AsyncSaveResponse
            blocked = time.perf_counter() - t0
            done_at = []
            fut.add_done_callback(lambda _: done_at.append(time.perf_counter()))
            self.pending = (fut, tmp, final, marker, t0, done_at, step)
            logger.info(
                f"checkpoint step-{step}: async save started, training loop blocked {blocked:.3f} s (staging)"
            )
            return
        dcp.save(state, checkpoint_id=tmp)
        written = time.perf_counter() - t0
        self._commit(tmp, final, marker, step)
        dist.barrier()
        logger.info(f"checkpoint step-{step} ({kind}) saved in {written:.3f} s (sync) to {final}")

    def poll(self) -> None:
        """Commit a finished async save (rank 0; no collective: DCP's own gather already waited for all ranks)."""
        if self.pending is not None and self.pending[0].done():
            self._finish_pending()

    def wait(self) -> None:
        """Block until an async save in flight is written and committed."""
        if self.pending is not None:
            t = time.perf_counter()
            self.pending[0].result()
            waited = time.perf_counter() - t
            if waited > 0.001:
                logger.info(f"checkpoint: waited {waited:.3f} s for the previous async save to finish")
            self._finish_pending()

    def _finish_pending(self) -> None:
        fut, tmp, final, marker, t0, done_at, step = self.pending
        self.pending = None
        fut.result()  # re-raises a failed write
        total = (done_at[0] if done_at else time.perf_counter()) - t0
        self._commit(tmp, final, marker, step)
        logger.info(f"checkpoint step-{step} saved in {total:.3f} s (async, in the background) to {final}")

    def _commit(self, tmp: str, final: str, marker: dict, step: int) -> None:
        if self.rank != 0:
            return
        fault_hook("save_written", step, self.rank)
        write_marker(tmp, marker)
        fault_hook("save_marked", step, self.rank)
        if os.path.exists(final):  # re-saving a step after resuming from an older load_step
            self._delete(final)
        os.rename(tmp, final)
        self._cleanup()

    def _delete(self, path: str) -> None:
        # Rename first (atomic) so a crash in the middle of rmtree never leaves a half-deleted "committed" folder.
        doomed = f"{path}.deleting-{uuid.uuid4().hex[:8]}"
        os.rename(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)

    def _cleanup(self) -> None:
        """Rank 0, right after a commit: drop leftovers of crashed saves and all but the newest keep_latest_k."""
        for name in os.listdir(self.folder):
            if (".tmp-" in name or ".deleting-" in name) and (
                self.pending is None or os.path.join(self.folder, name) != self.pending[1]
            ):
                shutil.rmtree(os.path.join(self.folder, name), ignore_errors=True)
        if self.c.keep_latest_k > 0:
            full = {
                s: p
                for s, p in committed_checkpoints(self.folder).items()
                if _read_json(os.path.join(p, MARKER))["kind"] == "full"
            }
            for s in sorted(full)[: -self.c.keep_latest_k]:
                if os.path.abspath(full[s]) != os.path.abspath(self.loaded_path or ""):
                    self._delete(full[s])

    # ---- load --------------------------------------------------------------------------------------------------

    def _pick(self) -> str | None:
        """The checkpoint to resume from: load_step, else the newest committed full or seed checkpoint."""
        found = committed_checkpoints(self.folder)
        if self.c.load_step >= 0:
            if self.c.load_step not in found:
                have = ", ".join(str(s) for s in sorted(found)) or "none"
                raise UserError(
                    f"checkpoint.load_step={self.c.load_step}: no committed step-{self.c.load_step} in {self.folder};"
                    f" committed steps: {have}"
                )
            return found[self.c.load_step]
        for s in sorted(found, reverse=True):
            if _read_json(os.path.join(found[s], MARKER))["kind"] in ("full", "seed"):
                return found[s]
        return None

    def load(self) -> tuple[int, int]:
        """Resume if there is something to resume from; returns (step, tokens_seen), (0, 0) for a fresh start."""
        if not self.c.enable and self.c.initial_load_path is None:
            return 0, 0
        picked = [self._pick() if self.rank == 0 and self.c.enable else None]
        dist.broadcast_object_list(picked, src=0)  # every rank must read the same checkpoint
        path = picked[0]
        model_only = False
        if path is None and self.c.initial_load_path:
            path, model_only = self.c.initial_load_path, self.c.initial_load_model_only
        if path is None:
            return 0, 0
        t0 = time.perf_counter()
        marker = verify_checkpoint(path)
        try:
            dcp.FileSystemReader(path).read_metadata()
        except Exception as e:
            raise UserError(
                f"checkpoint file {os.path.join(path, '.metadata')} is unreadable ({type(e).__name__}: {e})"[
                    :500
                ]
            ) from None
        model_only = model_only or marker["kind"] != "full"
        state = self._dcp_state(model_only=model_only)
        try:
            dcp.load(state, checkpoint_id=path)
        except Exception as e:  # DCP wraps per-rank failures; keep the message to one line
            msg = str(e).strip().splitlines()
            raise UserError(
                f"cannot load checkpoint {path}: {type(e).__name__}: {msg[0] if msg else ''}"[:500]
            ) from None
        set_model_state_dict(self.model, state["model"])
        if model_only:
            self.loaded_path = path
            logger.info(
                f"loaded model weights from {path} in {time.perf_counter() - t0:.3f} s (fresh optimizer)"
            )
            return 0, 0
        ts = self._read_train_state(path)
        for key, obj in self.extra_state.items():
            if ts.get(key) is not None:
                obj.load_state_dict(ts[key])
        groups = get_optimizer_state_dict(self.model, self.optimizer)["param_groups"]
        for g, saved in zip(groups, ts["param_groups"]):
            g.update({k: tuple(v) if isinstance(g.get(k), tuple) else v for k, v in saved.items()})
        set_optimizer_state_dict(
            self.model, self.optimizer, {"state": state["optimizer"], "param_groups": groups}
        )
        self.scheduler.load_state_dict({**self.scheduler.state_dict(), **ts["lr_scheduler"]})
        self._restore_data(path, ts)
        if ts["world_size"] == self.world_size:
            torch.set_rng_state(_unb64(ts["rng"]["cpu"]))
            if ts["rng"]["cuda"] and torch.cuda.is_available():
                torch.cuda.set_rng_state(_unb64(ts["rng"]["cuda"]))
        self.loaded_path = path
        logger.info(
            f"resumed from {path} (step {ts['step']}, {ts['tokens_seen']:,} tokens seen, saved by"
            f" {ts['world_size']} ranks) in {time.perf_counter() - t0:.3f} s"
        )
        return ts["step"], ts["tokens_seen"]

    def _read_train_state(self, path: str) -> dict:
        own = os.path.join(path, STATE_DIR, f"rank-{self.rank}.json")
        if os.path.exists(own):
            return _read_json(own)
        return _read_json(os.path.join(path, STATE_DIR, "rank-0.json"))  # fewer ranks saved than load now

    def _restore_data(self, path: str, mine: dict) -> None:
        """Data-loader position across layouts (docs/checkpointing.md, "Resharding").

        Same dp degree: each dp rank takes the state its dp rank saved (exact). Virtual shards (a state
        {"num_shards": K, "shards": {...}}) with unchanged K: the union of all ranks' shards, from which the new
        dp rank takes its own (exact for any dp degree). Otherwise every rank restarts its stream (replay).
        """
        if self.dataloader is None:
            return
        states = [
            _read_json(os.path.join(path, STATE_DIR, f))
            for f in sorted(os.listdir(os.path.join(path, STATE_DIR)))
            if f.endswith(".json")
        ]
        current = self.dataloader.state_dict()
        saved = [s["dataloader"] for s in states if s.get("dataloader") is not None]
        if "shards" in current and saved and all(s.get("num_shards") == current["num_shards"] for s in saved):
            merged = {"num_shards": current["num_shards"], "shards": {}}
            for s in saved:
                merged["shards"].update(s["shards"])
            self.dataloader.load_state_dict(merged)
            return
        if mine["dp_degree"] == self.dp:
            same = next((s for s in states if s["dp_rank"] == self.dp_rank), None)
            if same is not None and same.get("dataloader") is not None:
                self.dataloader.load_state_dict(same["dataloader"])
                return
        if self.rank == 0:
            logger.warning(
                f"data loader state in {path} was saved with {mine['dp_degree']} data-parallel ranks and cannot be"
                f" mapped to {self.dp}: every rank restarts its data stream from the beginning (data is replayed);"
                " set data.num_shards to resume exactly across dp degrees"
            )

    def close(self) -> None:
        self.wait()
