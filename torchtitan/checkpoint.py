"""Checkpoints that lose nothing: what is saved, when, where, atomically; resume; exports; preemption.

Layout (docs/checkpointing.md):

    <job.dump_folder>/<checkpoint.folder>/
        step-200/                      a committed checkpoint (only names `step-<N>` with a marker are read)
            .metadata, __<r>_0.distcp  DCP: model weights and optimizer state, sharded, any layout can read them
            train_state/rank-<r>.json  per global rank: step, tokens seen, LR schedule, optimizer hyper-parameters,
                                       data-loader position, RNG states (plain JSON: nothing is unpickled)
            COMMITTED.json             written last: kind (full | seed | export), step, model and tokenizer it
                                       belongs to, every file with its size and content checksum
        step-300.tmp-<id>/             a save in progress or a crashed one: never read, deleted by a later save

A save writes into `step-N.tmp-<id>`; when every rank's data is on disk, rank 0 writes COMMITTED.json and renames
the folder to `step-N` (rename is atomic on POSIX). A process killed at any moment therefore leaves either the old
set of checkpoints or the old set plus the new one, never a half-written `step-N`.

Nothing lost, nothing silent: a save that fails (full disk, I/O error, read-only folder; sync or async) stops the
run on every rank with one line (what failed, free space, the last good checkpoint), exit code 2, after removing
its partial folder; older checkpoints are never touched. A load first checks the marker: sizes, checksums
(checkpoint.verify_on_load, shared out over the ranks), the tokenizer and every parameter's shape against the
model being built, so a corrupt file, a replaced tokenizer or another model's checkpoint is one line, not a
traceback from DCP or silently wrong weights.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
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
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from torchtitan.checksums import ALGORITHMS, DEFAULT_ALGORITHM, ChecksumWriter, bytes_checksum, file_checksum
from torchtitan.disk import fmt_bytes, free_bytes, free_text
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
    Points: step_end (after a training step), and inside a save: save_begin, save_data (before the first byte of
    each of this rank's data files, in the writing thread), save_written (data on disk, no marker), save_marked
    (marker written, folder not yet renamed). TORCHTITAN_TEST_IO_ERROR (torchtitan/checksums.py) injects an
    OSError at a data file's first write instead.
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


def _write_json(path: str, obj) -> tuple[int, str]:
    """Write `obj` as JSON, atomically; returns (size, checksum) of the bytes written."""
    data = json.dumps(obj).encode("utf-8")
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return len(data), bytes_checksum(data)


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


def _file_size(entry) -> int:
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
    marker = _read_json(marker_path)
    for rel, entry in marker.get("files", {}).items():
        f = os.path.join(path, rel)
        if not os.path.exists(f):
            raise UserError(f"checkpoint file {f} is missing; the checkpoint is incomplete")
        actual, size = os.path.getsize(f), _file_size(entry)
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
    for rel in sorted(files, key=lambda r: (-_file_size(files[r]), r)):
        r = min(range(world), key=lambda i: load[i])
        load[r] += _file_size(files[rel])
        if r == rank:
            mine.append(rel)
    return mine


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
            marker = _read_json(os.path.join(path, MARKER))
        except UserError:
            continue
        if marker.get("kind") == "full":
            sizes.append(sum(_file_size(e) for e in marker.get("files", {}).values()))
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


# ------------------------------------------------------------------------------------------------ save failures


def _os_error(e: BaseException | None) -> OSError | None:
    """The OSError behind a failed save: in DCP's per-rank failures or the exception chain."""
    todo, seen = [e], set()
    while todo:
        x = todo.pop(0)
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, OSError):
            return x
        if isinstance(x, CheckpointException):
            todo += [f[0] if isinstance(f, tuple) else f for f in x.failures.values()]
        todo += [x.__cause__, x.__context__]
    return None


def _save_failure(step: int, tmp: str, e: BaseException, writer: ChecksumWriter | None = None) -> tuple:
    """(step, tmp, what failed, errno, preference): an OSError's account (0) is preferred to another (1)."""
    err = (writer.error if writer is not None else None) or _os_error(e)
    if err is not None:
        where = f" ({err.filename})" if err.filename else ""
        return step, tmp, f"{err.strerror or err}{where}", err.errno or 0, 0
    lines = str(e).strip().splitlines()
    return step, tmp, f"{type(e).__name__}: {lines[0] if lines else ''}"[:300], 0, 1


_NO_SPACE = {28, 122}  # ENOSPC, EDQUOT
_NOT_WRITABLE = {1, 13, 30}  # EPERM, EACCES, EROFS


def _default_stager():
    """A DefaultStager (torch >= 2.9; None before, where dcp.async_save stages as it always did): its staging copy
    is kept from save to save instead of being allocated at every save (DCP's default); on CUDA the copy is
    pinned memory and the device-to-host copies are non-blocking."""
    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    except ImportError:  # pragma: no cover - torch < 2.9
        return None
    cuda = torch.cuda.is_available()
    # Positional: the fourth field was `use_cuda_non_blocking_copy` before torch renamed it `use_non_blocking_copy`
    # (pytorch#158337); the order (pinned, shared, async staging, non-blocking copy) is the same in both.
    return DefaultStager(
        StagingOptions(
            cuda,  # pinned host memory for the staging copy
            False,  # no shared memory (the writer is a thread of this process)
            False,  # synchronous staging: the loop waits for the copy (as before); the write runs in the background
            cuda,  # non-blocking device-to-host copies, synchronized before stage() returns
        )
    )


@functools.cache
def stager_survives_reuse() -> bool:
    """Whether one DefaultStager can stage more than once. torch 2.11 closes it at the end of every stage(), so a
    second save fails with `KeyError: <class 'type'>` (pytorch#183413); probed once on a tiny CPU tensor."""
    stager = _default_stager()
    if stager is None:
        return False
    try:
        for _ in range(2):
            stager.stage({"x": torch.zeros(1)})
        return True
    except KeyError:
        return False
    finally:
        stager.close()


def build_stager():
    """The async stager of a run, one for all its saves, so the staging copy is allocated once.

    A DefaultStager where torch can reuse one. Where it cannot (torch 2.11), on CUDA: torch's BlockingAsyncStager
    with its cache, which pins one host copy at the first save and copies into it at every later one (the same
    effect; its copies are blocking, which the loop waited for anyway). Without CUDA that cache cannot be used
    (it is always pinned), so the DefaultStager stays and `stager_for_save` replaces it at every save."""
    if stager_survives_reuse() or not torch.cuda.is_available():
        return _default_stager()
    from torch.distributed.checkpoint.staging import BlockingAsyncStager

    return BlockingAsyncStager(cache_staged_state_dict=True)


def stager_for_save(current):
    """The stager for the next async save: the run's own, except a DefaultStager that torch cannot reuse, which
    is replaced by a fresh one (staging memory then allocated at every save, as DCP's default does)."""
    if current is None or stager_survives_reuse():
        return current
    from torch.distributed.checkpoint.staging import DefaultStager

    return _default_stager() if isinstance(current, DefaultStager) else current


# ----------------------------------------------------------------------------------------------------- manager


@dataclasses.dataclass
class _Pending:
    """An async save in flight."""

    future: object
    writer: ChecksumWriter
    tmp: str
    final: str
    marker: dict
    step: int
    t0: float
    done_at: list


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
        if dist.get_backend() != "fake":  # the fake-backend simulation (simulate.py) moves no objects
            dist.broadcast_object_list(ids, src=0)
        self.save_id = ids[0]
        # An async save runs collectives in a background thread; on its own gloo group they never interleave
        # with the training step's collectives on the default group.
        self.async_pg = dist.new_group(backend="gloo") if self.c.async_mode == "async" else None
        self.stager = build_stager() if self.c.async_mode == "async" else None
        self.pending: _Pending | None = None
        self.failure: tuple | None = None  # this rank's account of a save that failed, until it is reported
        self.loaded_path: str | None = None
        self._chosen: tuple[str | None, bool] | None = None  # see _choose
        self.identity = run_identity(cfg, getattr(dataloader, "tokenizer", None))

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
        """Save at `step` (all ranks). kind: full (resumable), export (model only, export_dtype), seed (step 0).

        A failure on any rank (this save's, or the previous async one's) raises the same one-line UserError on
        every rank, after rank 0 removed the partial folder; older checkpoints are untouched.
        """
        self.wait()  # never two saves in flight
        final = os.path.join(self.folder, f"step-{step}")
        tmp = f"{final}.tmp-{self.save_id}"
        t0 = time.perf_counter()
        fault_hook("save_begin", step, self.rank)
        extra, failure = {}, self.failure
        try:
            os.makedirs(os.path.join(tmp, STATE_DIR), exist_ok=True)
            if kind == "full":
                rel = f"{STATE_DIR}/rank-{self.rank}.json"
                extra[rel] = _write_json(os.path.join(tmp, rel), self._train_state(step, tokens_seen))
        except OSError as e:
            failure = failure or _save_failure(step, tmp, e)
        self._agree(failure, tmp)  # every rank has its folder and JSON, or every rank stops here
        dtype = (
            {"float32": torch.float32, "bfloat16": torch.bfloat16}[self.c.export_dtype]
            if kind == "export"
            else None
        )
        state = self._dcp_state(model_only=kind != "full", dtype=dtype)
        marker = {"kind": kind, "step": step, "tokens_seen": tokens_seen, "world_size": self.world_size}
        marker.update(self.identity)
        writer = ChecksumWriter(
            tmp, step=step, extra_files=extra, fault=lambda rel: fault_hook("save_data", step, self.rank)
        )
        if self.c.async_mode == "async" and kind == "full":
            self.stager = stager_for_save(self.stager)
            stager = {"async_stager": self.stager} if self.stager is not None else {}
            fut = dcp.async_save(state, storage_writer=writer, process_group=self.async_pg, **stager)
            fut = getattr(fut, "upload_completion", fut)  # torch >= 2.9 may return an AsyncSaveResponse
            blocked = time.perf_counter() - t0
            done_at = []
            fut.add_done_callback(lambda _: done_at.append(time.perf_counter()))
            self.pending = _Pending(fut, writer, tmp, final, marker, step, t0, done_at)
            logger.info(
                f"checkpoint step-{step}: async save started, training loop blocked {blocked:.3f} s (staging)"
            )
            return
        try:
            dcp.save(state, storage_writer=writer)
            written = time.perf_counter() - t0
            self._commit(tmp, final, marker, step, writer.checksums)
        except (Exception, CheckpointException) as e:  # DCP raises the same failure on every rank
            failure = _save_failure(step, tmp, e, writer)
        self._agree(failure)
        logger.info(f"checkpoint step-{step} ({kind}) saved in {written:.3f} s (sync) to {final}")

    def poll(self) -> None:
        """Commit a finished async save (rank 0; no collective: DCP's own gather already waited for all ranks)."""
        if self.pending is not None and self.pending.future.done():
            self._finish_pending()

    def wait(self) -> None:
        """Block until an async save in flight is written and committed (no collective; a failure is kept for
        `failed` / `report_failure`)."""
        if self.pending is not None:
            t = time.perf_counter()
            try:
                self.pending.future.result()
            except (Exception, CheckpointException):
                pass  # _finish_pending records it
            waited = time.perf_counter() - t
            if waited > 0.001:
                logger.info(f"checkpoint: waited {waited:.3f} s for the previous async save to finish")
            self._finish_pending()

    def _finish_pending(self) -> None:
        p, self.pending = self.pending, None
        try:
            p.future.result()  # re-raises a failed write
            self._commit(p.tmp, p.final, p.marker, p.step, p.writer.checksums)
        except (Exception, CheckpointException) as e:
            self.failure = self.failure or _save_failure(p.step, p.tmp, e, p.writer)
            return  # reported by every rank together: the trainer's next step, the next save, or close()
        total = (p.done_at[0] if p.done_at else time.perf_counter()) - p.t0
        logger.info(
            f"checkpoint step-{p.step} saved in {total:.3f} s (async, in the background) to {p.final}"
        )

    def failed(self) -> bool:
        """This rank knows of a failed save (the trainer adds it to its check steps' all-reduce of flags); an
        async save that has finished since the last look is committed or recorded first."""
        self.poll()
        return self.failure is not None

    def report_failure(self) -> None:
        """All ranks, when some rank's save failed: every rank raises the same one-line UserError (exit 2)."""
        self.wait()
        self._agree(self.failure)

    def _agree(self, failure: tuple | None, started: str | None = None) -> None:
        """Collective: when any rank reports a failure, rank 0 removes the partial folder (and `started`, the
        folder of a save this one cut short) and writes the account (what failed, free space, last good
        checkpoint), and every rank raises it."""
        failures = [None] * self.world_size
        dist.all_gather_object(failures, failure)
        failures = [f for f in failures if f is not None]
        if not failures:
            return
        message = [None]
        if self.rank == 0:
            if started is not None:
                shutil.rmtree(started, ignore_errors=True)
            message[0] = self._failure_message(*min(failures, key=lambda f: f[4])[:4])
        dist.broadcast_object_list(message, src=0)
        self.failure = None
        raise UserError(message[0])

    def _failure_message(self, step: int, tmp: str, what: str, err: int) -> str:
        removed = ""
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
            removed = "; partial folder " + ("could not be removed" if os.path.exists(tmp) else "removed")
        last = self._last_good()
        if err in _NO_SPACE:
            fix = f"free space at {self.folder} (or lower checkpoint.keep_latest_k)"
        elif err in _NOT_WRITABLE:
            fix = f"make {self.folder} writable"
        else:
            fix = f"check the storage of {self.folder}"
        then = f"rerun to resume from step {last[0]}" if last else "rerun (no checkpoint to resume from yet)"
        last_text = f"{last[1]} (step {last[0]})" if last else "none"
        return (
            f"checkpoint step-{step} could not be saved: {what}; {free_text(self.folder)} at {self.folder};"
            f" last good checkpoint: {last_text}{removed}; {fix}, then {then}"
        )

    def _last_good(self) -> tuple[int, str] | None:
        for s, path in sorted(committed_checkpoints(self.folder).items(), reverse=True):
            try:
                if _read_json(os.path.join(path, MARKER)).get("kind") in ("full", "seed"):
                    return s, path
            except UserError:
                continue
        return None

    def _commit(self, tmp: str, final: str, marker: dict, step: int, checksums: dict | None) -> None:
        if self.rank != 0:
            return
        fault_hook("save_written", step, self.rank)
        write_marker(tmp, marker, checksums)
        fault_hook("save_marked", step, self.rank)
        if os.path.exists(final):  # re-saving a step after resuming from an older load_step
            self._delete(final)
        os.rename(tmp, final)
        try:
            self._cleanup()
        except OSError as e:  # the new checkpoint is committed; an old one that cannot be deleted stays
            logger.warning(f"checkpoint cleanup in {self.folder} failed: {e}; older checkpoints are kept")

    def _delete(self, path: str) -> None:
        # Rename first (atomic) so a crash in the middle of rmtree never leaves a half-deleted "committed" folder.
        doomed = f"{path}.deleting-{uuid.uuid4().hex[:8]}"
        os.rename(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)

    def _cleanup(self) -> None:
        """Rank 0, right after a commit: drop leftovers of crashed saves and all but the newest keep_latest_k."""
        for name in os.listdir(self.folder):
            if (".tmp-" in name or ".deleting-" in name) and (
                self.pending is None or os.path.join(self.folder, name) != self.pending.tmp
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

    def _choose(self) -> tuple[str | None, bool]:
        """(the checkpoint this run loads or None, whether it is initial_load_path): the same on every rank
        (rank 0 chooses), and chosen once, so `load` reads the checkpoint `path_to_load` announced."""
        if self._chosen is None:
            picked = None
            if self.c.enable or self.c.initial_load_path is not None:
                box = [_to_load(self.cfg) if self.rank == 0 else None]
                dist.broadcast_object_list(box, src=0)
                picked = box[0]
            self._chosen = picked or (None, False)
        return self._chosen

    def path_to_load(self) -> str | None:
        """The checkpoint `load` will read, or None for a fresh start. Known before the model is initialized, so
        a run that resumes or starts from initial_load_path draws no random weights."""
        return self._choose()[0]

    def load(self) -> tuple[int, int]:
        """Resume if there is something to resume from; returns (step, tokens_seen), (0, 0) for a fresh start."""
        path, initial = self._choose()
        if path is None:
            return 0, 0
        model_only = initial and self.c.initial_load_model_only
        t0 = time.perf_counter()
        marker = verify_checkpoint(path)
        meta = _read_metadata(path)
        # Cheap checks first, all before DCP reads a byte of tensor data: a wrong tokenizer or model is one line
        # (check_resume_target said it already, before the model was built; this covers a checkpoint that
        # appeared since, and the warning about a tokenizer with other content).
        check_compatible(self.cfg, self.identity, path, marker, meta, initial)
        self._warn_tokenizer_content(path, marker)
        if self.c.verify_on_load:
            self._verify_content(path, marker)
        model_only = model_only or marker["kind"] != "full"
        state = self._dcp_state(model_only=model_only)
        try:
            dcp.load(state, checkpoint_id=path)
        except (
            Exception,
            CheckpointException,
        ) as e:  # DCP wraps per-rank failures; keep the message to one line
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

    def _warn_tokenizer_content(self, path: str, marker: dict) -> None:
        saved, now = marker.get("tokenizer"), self.identity.get("tokenizer")
        if saved and now and saved["checksum"] != now["checksum"] and self.rank == 0:
            logger.warning(
                f"tokenizer {now['path']} differs from the one checkpoint {path} was trained with ({saved['path']},"
                f" also {saved['vocab_size']} tokens, other content): token ids may now stand for other text"
            )

    def _verify_content(self, path: str, marker: dict) -> None:
        """Checksums of every file against the marker, the files shared out over the ranks (one full read of the
        checkpoint in all); the first mismatch any rank finds is raised on every rank."""
        files = marker.get("files", {})
        if not files or marker.get("checksum") is None:
            return
        t = time.perf_counter()
        mine = _share(files, self.rank, self.world_size)
        found = [None] * self.world_size
        dist.all_gather_object(found, checksum_mismatch(path, marker, mine))
        bad = next((f for f in found if f), None)
        if bad is not None:
            raise UserError(bad)
        size = sum(_file_size(e) for e in files.values())
        logger.info(
            f"checkpoint {path}: {len(files)} files ({fmt_bytes(size)}) match their {marker['checksum']} checksums,"
            f" verified by {self.world_size} rank(s) in {time.perf_counter() - t:.3f} s (checkpoint.verify_on_load)"
        )

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
        """All ranks, at the end of a run: the last async save is waited for, committed, and a failure reported."""
        self.wait()
        self._agree(self.failure)
        if self.stager is not None:
            self.stager.close()
            self.stager = None


# ------------------------------------------------------------------------------------- what a checkpoint belongs to


def run_identity(cfg, tokenizer) -> dict:
    """What a checkpoint belongs to, recorded in its marker and compared on load: the model and tokenizer."""
    from torchtitan.models import model_args_from_config

    m = cfg.model
    args = model_args_from_config(m, cfg.training.seq_len)
    out = {"model": {"name": m.name, "flavor": m.flavor, "args": dataclasses.asdict(args)}}
    if tokenizer is not None and os.path.isfile(getattr(tokenizer, "path", "")):
        out["tokenizer"] = {
            "path": os.path.abspath(tokenizer.path),
            "vocab_size": tokenizer.vocab_size,
            "checksum": file_checksum(tokenizer.path),
        }
    return out


def _to_load(cfg) -> tuple[str, bool] | None:
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
            if _read_json(os.path.join(found[s], MARKER))["kind"] in ("full", "seed"):
                return found[s], False
    return (c.initial_load_path, True) if c.initial_load_path else None


def _read_metadata(path: str):
    try:
        return dcp.FileSystemReader(path).read_metadata()
    except Exception as e:
        raise UserError(
            f"checkpoint file {os.path.join(path, '.metadata')} is unreadable ({type(e).__name__}: {e})"[:500]
        ) from None


def check_resume_target(cfg, tokenizer) -> None:
    """Every rank, before the model is built: the checkpoint this run will load (if any) is complete (sizes) and
    belongs to this run's model and tokenizer; else one line (exit 2) at once, not after minutes of building and
    initializing a model that cannot load it. Reads only the marker and DCP's .metadata."""
    picked = None if cfg.checkpoint.create_seed_checkpoint else _to_load(cfg)  # a seed run loads nothing
    if picked is None:
        return
    path, initial = picked
    check_compatible(
        cfg, run_identity(cfg, tokenizer), path, verify_checkpoint(path), _read_metadata(path), initial
    )


def check_compatible(cfg, identity: dict, path: str, marker: dict, meta, initial: bool) -> None:
    """The checkpoint must belong to this run's model and tokenizer: else one line naming the difference."""
    saved, now = marker.get("tokenizer"), identity.get("tokenizer")
    if saved and now and saved["path"] == now["path"] and saved["vocab_size"] != now["vocab_size"]:
        raise UserError(  # the same file, replaced: that is the cause, whatever the model check would say
            f"tokenizer changed since checkpoint {path} was written: it was trained with {saved['path']}"
            f" ({saved['vocab_size']} tokens), this run uses {now['path']} ({now['vocab_size']} tokens);"
            " restore the original tokenizer file, or start a new run in another job.dump_folder"
        )
    _check_model(cfg, identity, path, marker, meta, initial)


def _check_model(cfg, identity: dict, path: str, marker: dict, meta, initial: bool) -> None:
    """Every parameter of the model this run builds must exist in the checkpoint with the same global shape,
    and the checkpoint must hold no other: else one line naming the first difference and what to change."""
    from torchtitan.models import get_model_class, model_args_from_config

    args = model_args_from_config(cfg.model, cfg.training.seq_len)
    with torch.device("meta"):  # the whole model, whatever part of it this rank holds: no memory used
        ours = {k: list(v.shape) for k, v in get_model_class(cfg.model.name)(args).state_dict().items()}
    theirs = {
        k.removeprefix("model."): list(m.size)
        for k, m in meta.state_dict_metadata.items()
        if k.startswith("model.") and isinstance(m, TensorStorageMetadata)
    }
    diff = next(((k, theirs.get(k), s) for k, s in ours.items() if theirs.get(k) != s), None)
    diff = diff or next(((k, s, None) for k, s in theirs.items() if k not in ours), None)
    if diff is None:
        return
    name, saved_shape, our_shape = diff
    m = cfg.model
    fix = _model_fix(
        marker.get("model"), marker.get("tokenizer"), identity.get("tokenizer"), m, args, initial
    )
    raise UserError(
        f"checkpoint {path} belongs to another model: parameter {name} is {saved_shape or 'absent'} there"
        f" and {our_shape or 'absent'} in this run's model ({m.name} {m.flavor}, {_describe_args(args)});"
        f" the checkpoint's model: {_describe_model(marker.get('model'))}; {fix}"
    )


def _describe_args(a) -> str:
    a = a if isinstance(a, dict) else dataclasses.asdict(a)
    return (
        f"dim {a['dim']}, {a['n_layers']} layers, {a['n_heads']} heads, {a['n_kv_heads']} kv heads,"
        f" vocab {a['vocab_size']}" + (", tied embeddings" if a.get("tie_embeddings") else "")
    )


_SHAPE_FIELDS = ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "ffn_hidden_dim", "tie_embeddings")


def _shape(args) -> dict:
    """The fields of (recorded) ModelArgs that decide parameter shapes."""
    from torchtitan.models.llama3 import ModelArgs

    if isinstance(args, dict):
        fields = {f.name for f in dataclasses.fields(ModelArgs)}
        args = ModelArgs(**{k: v for k, v in args.items() if k in fields})
    return {k: getattr(args, k) for k in _SHAPE_FIELDS}


def _model_fix(
    saved: dict | None, saved_tok: dict | None, now_tok: dict | None, cfg_model, args, initial
) -> str:
    """What to change so that this run loads the checkpoint, from the model and tokenizer in its marker."""
    from torchtitan.models import MODELS

    elsewhere = (
        "or point checkpoint.initial_load_path at a checkpoint of this model"
        if initial
        else "or train this model in another job.dump_folder (or checkpoint.folder)"
    )
    if not saved or "args" not in saved:
        return f"use the model it was written for, {elsewhere}"
    sa, ours = _shape(saved["args"]), _shape(args)
    name = saved.get("name") or cfg_model.name
    flavors = MODELS[name][1] if name in MODELS else {}
    same = [k for k in _SHAPE_FIELDS if k != "vocab_size"]
    flavor = saved.get("flavor") or next(
        (f for f, a in flavors.items() if all(_shape(a)[k] == sa[k] for k in same)), None
    )
    flags = [f"--model.name={name}"] if name != cfg_model.name else []
    new_flavor = flavor in flavors and flavor != cfg_model.flavor
    if new_flavor:
        flags.append(f"--model.flavor={flavor}")
    # the vocabulary the run would have after that flag: its own override, else the flavor's
    vocab_then = cfg_model.vocab_size or (flavors[flavor].vocab_size if new_flavor else args.vocab_size)
    if sa["vocab_size"] != vocab_then:
        flags.append(f"--model.vocab_size={sa['vocab_size']}")
    if saved_tok and now_tok and saved_tok["path"] != now_tok["path"]:
        flags.append(f"--model.tokenizer_path={saved_tok['path']}")
    elif flags and sa["vocab_size"] != args.vocab_size:
        flags.append("and its tokenizer")
    if flags:
        verb = "load" if initial else "resume from"
        return f"to {verb} it set {' '.join(flags)}, {elsewhere}"
    diffs = [f"{k} {sa[k]} vs {ours[k]}" for k in _SHAPE_FIELDS if sa[k] != ours[k]]
    if diffs:
        return f"no flavor has its shape ({', '.join(diffs)}: checkpoint vs this run); {elsewhere[3:]}"
    return f"the model definition changed since it was written (same config, other shapes): restore it, {elsewhere}"


def _describe_model(saved: dict | None) -> str:
    if not saved or "args" not in saved:
        return "not recorded (written by another tool or an older version)"
    name = " ".join(str(saved[k]) for k in ("name", "flavor") if saved.get(k))
    return f"{name} ({_describe_args(saved['args'])})" if name else _describe_args(saved["args"])
