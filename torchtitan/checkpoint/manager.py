"""CheckpointManager: what a run saves, when, where, and how it resumes (the package's docstring has the layout).

The manager decides; the modules beside it do the parts: integrity (the marker and the checks before a load),
checksums (hashing while DCP writes), staging (async saves), failures (a failed save as one line), folder (which
checkpoint to load, which to keep), train_state (the per-rank JSON), compat (does the checkpoint fit this model).
"""

from __future__ import annotations

import os
import shutil
import time
import uuid

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from torchtitan.checkpoint.checksums import ChecksumWriter
from torchtitan.checkpoint.compat import check_compatible, read_metadata, run_identity, warn_tokenizer_content
from torchtitan.checkpoint.failures import failure_message, save_failure
from torchtitan.checkpoint.folder import checkpoint_to_load, clean_up, delete
from torchtitan.checkpoint.integrity import verify_checkpoint, verify_content, write_json, write_marker
from torchtitan.checkpoint.staging import PendingSave, build_stager, stager_for_save
from torchtitan.checkpoint.train_state import (
    STATE_DIR,
    read_train_state,
    restore_data,
    restore_rng,
    train_state,
)
from torchtitan.errors import UserError
from torchtitan.log import logger
from torchtitan.testing import faults


def model_view(model_parts: list[nn.Module]) -> nn.Module:
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
        self.model = model_view(model_parts)
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
        self.pending: PendingSave | None = None
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
        faults.kill_at("save_begin", step, self.rank)
        extra, failure = {}, self.failure
        try:
            os.makedirs(os.path.join(tmp, STATE_DIR), exist_ok=True)
            if kind == "full":
                rel = f"{STATE_DIR}/rank-{self.rank}.json"
                extra[rel] = write_json(os.path.join(tmp, rel), train_state(self, step, tokens_seen))
        except OSError as e:
            failure = failure or save_failure(step, tmp, e)
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
            tmp,
            extra_files=extra,
            before_data_file=lambda path: faults.before_data_file(step, self.rank, path),
        )
        if self.c.async_mode == "async" and kind == "full":
            self.stager = stager_for_save(self.stager)
            stager = {"async_stager": self.stager} if self.stager is not None else {}
            fut = dcp.async_save(state, storage_writer=writer, process_group=self.async_pg, **stager)
            fut = getattr(fut, "upload_completion", fut)  # torch >= 2.9 may return an AsyncSaveResponse
            blocked = time.perf_counter() - t0
            done_at = []
            fut.add_done_callback(lambda _: done_at.append(time.perf_counter()))
            self.pending = PendingSave(fut, writer, tmp, final, marker, step, t0, done_at)
            logger.info(
                f"checkpoint step-{step}: async save started, training loop blocked {blocked:.3f} s (staging)"
            )
            return
        try:
            dcp.save(state, storage_writer=writer)
            written = time.perf_counter() - t0
            self._commit(tmp, final, marker, step, writer.checksums)
        except (Exception, CheckpointException) as e:  # DCP raises the same failure on every rank
            failure = save_failure(step, tmp, e, writer)
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
            self.failure = self.failure or save_failure(p.step, p.tmp, e, p.writer)
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
            message[0] = failure_message(self.folder, *min(failures, key=lambda f: f[4])[:4])
        dist.broadcast_object_list(message, src=0)
        self.failure = None
        raise UserError(message[0])

    def _commit(self, tmp: str, final: str, marker: dict, step: int, checksums: dict | None) -> None:
        if self.rank != 0:
            return
        faults.kill_at("save_written", step, self.rank)
        write_marker(tmp, marker, checksums)
        faults.kill_at("save_marked", step, self.rank)
        if os.path.exists(final):  # re-saving a step after resuming from an older load_step
            delete(final)
        os.rename(tmp, final)
        try:
            clean_up(
                self.folder,
                self.c.keep_latest_k,
                self.pending.tmp if self.pending else None,
                self.loaded_path,
            )
        except OSError as e:  # the new checkpoint is committed; an old one that cannot be deleted stays
            logger.warning(f"checkpoint cleanup in {self.folder} failed: {e}; older checkpoints are kept")

    # ---- load --------------------------------------------------------------------------------------------------

    def _choose(self) -> tuple[str | None, bool]:
        """(the checkpoint this run loads or None, whether it is initial_load_path): the same on every rank
        (rank 0 chooses), and chosen once, so `load` reads the checkpoint `path_to_load` announced."""
        if self._chosen is None:
            picked = None
            if self.c.enable or self.c.initial_load_path is not None:
                box = [checkpoint_to_load(self.cfg) if self.rank == 0 else None]
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
        meta = read_metadata(path)
        # Cheap checks first, all before DCP reads a byte of tensor data: a wrong tokenizer or model is one line
        # (check_resume_target said it already, before the model was built; this covers a checkpoint that
        # appeared since, and the warning about a tokenizer with other content).
        check_compatible(self.cfg, self.identity, path, marker, meta, initial)
        warn_tokenizer_content(self.identity, path, marker, self.rank)
        if self.c.verify_on_load:
            verify_content(path, marker, self.rank, self.world_size)
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
        ts = read_train_state(path, self.rank)
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
        restore_data(self, path, ts)
        restore_rng(ts, self.world_size)
        self.loaded_path = path
        logger.info(
            f"resumed from {path} (step {ts['step']}, {ts['tokens_seen']:,} tokens seen, saved by"
            f" {ts['world_size']} ranks) in {time.perf_counter() - t0:.3f} s"
        )
        return ts["step"], ts["tokens_seen"]

    def close(self) -> None:
        """All ranks, at the end of a run: the last async save is waited for, committed, and a failure reported."""
        self.wait()
        self._agree(self.failure)
        if self.stager is not None:
            self.stager.close()
            self.stager = None
