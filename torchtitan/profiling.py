"""Profiling: torch.profiler traces on a fixed cadence, memory snapshots of chosen steps, and the out-of-memory exit.

Traces: one step recorded every `profiling.profile_freq` steps, per rank.
Memory (`profiling.memory_snapshot_steps`), per rank and listed step:
  CUDA  the caching allocator's history (torch.cuda.memory._record_memory_history) from the start of the step,
        dumped at its end as <dump>/<memory_snapshot_folder>/rank<r>_step<N>.pickle: drag it into
        https://pytorch.org/memory_viz to see every live allocation, its size and the stack that made it.
  CPU   the step under torch.profiler with profile_memory: rank<r>_step<N>_memory_trace.json, a Chrome trace
        whose "[memory]" events record every allocation and free with the bytes then allocated (Perfetto draws
        them as a memory counter under the ops), and rank<r>_step<N>_memory_ops.txt, the ops that allocated the
        most. (torch's export_memory_timeline, the categorized view, fails on FSDP steps in torch 2.13 with an
        internal "duplicate outputs" assertion, so it is not used.)
Out of memory (CUDA): the trainer catches torch.cuda.OutOfMemoryError, dumps a snapshot (with stack traces when
`profiling.record_memory_history` recorded them), prints one line with its path and exits with EXIT_OOM.
"""

from __future__ import annotations

import json
import os

import torch

from torchtitan.errors import UserError
from torchtitan.log import logger
from torchtitan.testing import faults

EXIT_OOM = 4  # out of device memory; the snapshot's path is in the message (docs/launching.md, exit codes)
_HISTORY_ENTRIES = 100_000  # allocation events kept: enough for several steps of a large model


def _cuda() -> bool:
    return torch.cuda.is_available()


class Profiler:
    """Call `step()` after every training step and `stop()` at the end; does nothing unless enabled."""

    def __init__(self, cfg, rank: int, dump_folder: str, start_step: int = 0):
        p = cfg.profiling
        self.step_num = start_step
        self.rank = rank
        self.prof = None
        self.memory_steps = set(p.memory_snapshot_steps)
        self.memory_folder = os.path.join(dump_folder, p.memory_snapshot_folder)
        self.keep_history = p.record_memory_history and _cuda()
        self.memory_prof = None  # CPU: the memory profiler of the step in progress
        if self.memory_steps and not _cuda() and p.enable_profiling:
            raise UserError(
                "profiling.memory_snapshot_steps on CPU records the step with torch.profiler, which cannot run"
                " next to profiling.enable_profiling=true; turn one of them off"
            )
        if self.keep_history:
            torch.cuda.memory._record_memory_history(max_entries=_HISTORY_ENTRIES)
        if p.enable_profiling:
            self.folder = os.path.join(dump_folder, p.save_traces_folder)
            os.makedirs(self.folder, exist_ok=True)
            activities = [torch.profiler.ProfilerActivity.CPU]
            if _cuda():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            warmup = 1 if p.profile_freq > 1 else 0
            self.prof = torch.profiler.profile(
                activities=activities,
                schedule=torch.profiler.schedule(wait=p.profile_freq - 1 - warmup, warmup=warmup, active=1),
                on_trace_ready=self._save,
                record_shapes=True,
            )
            self.prof.start()
        self._memory_begin(start_step + 1)

    def _save(self, prof) -> None:
        path = os.path.join(self.folder, f"rank{self.rank}_step{self.step_num}.json")
        prof.export_chrome_trace(path)
        logger.info("profiler trace written to %s", path)

    def step(self) -> None:
        self.step_num += 1
        if self.prof is not None:
            self.prof.step()
        if self.step_num in self.memory_steps:
            self._memory_end(self.step_num)
        self._memory_begin(self.step_num + 1)
        faults.oom_at(self.step_num, self.rank)

    def stop(self) -> None:
        if self.prof is not None:
            self.prof.stop()
        if self.memory_prof is not None:
            self.memory_prof.stop()
            self.memory_prof = None

    # ---- memory snapshots ----------------------------------------------------------------------------------

    def _memory_begin(self, step: int) -> None:
        if step not in self.memory_steps:
            return
        os.makedirs(self.memory_folder, exist_ok=True)
        if _cuda():
            if not self.keep_history:
                torch.cuda.memory._record_memory_history(max_entries=_HISTORY_ENTRIES)
            return
        self.memory_prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            profile_memory=True,
            record_shapes=True,  # the ops table groups by shape too
        )
        self.memory_prof.start()

    def _memory_end(self, step: int) -> None:
        base = os.path.join(self.memory_folder, f"rank{self.rank}_step{step}")
        try:  # a failed dump costs the snapshot, never the run
            if _cuda():
                torch.cuda.memory._dump_snapshot(f"{base}.pickle")
                if not self.keep_history:
                    torch.cuda.memory._record_memory_history(enabled=None)
                where = f"{base}.pickle (open it at https://pytorch.org/memory_viz)"
            else:
                prof, self.memory_prof = self.memory_prof, None
                prof.stop()
                prof.export_chrome_trace(f"{base}_memory_trace.json")
                table = prof.key_averages().table(sort_by="self_cpu_memory_usage", row_limit=40)
                with open(f"{base}_memory_ops.txt", "w", encoding="utf-8") as f:
                    f.write(table)
                where = f"{base}_memory_trace.json (Perfetto) and {base}_memory_ops.txt"
        except Exception as e:
            logger.warning(f"memory snapshot of step {step} failed: {type(e).__name__}: {e}")
            return
        logger.info(f"memory of step {step} written to {where}")


def write_oom_snapshot(folder: str, rank: int, step: int) -> str | None:
    """Dump the memory state at an out-of-memory error; returns the file's path (None if it could not be written).

    CUDA: the allocator snapshot (every segment and block; with stack traces if history was being recorded).
    Elsewhere (the test hook on CPU): the process memory numbers the step log has, as JSON.
    """
    try:
        os.makedirs(folder, exist_ok=True)
        if _cuda():
            path = os.path.join(folder, f"rank{rank}_oom_step{step}.pickle")
            torch.cuda.memory._dump_snapshot(path)
        else:
            from torchtitan.metrics.memory import MemoryMonitor

            path = os.path.join(folder, f"rank{rank}_oom_step{step}.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump({"step": step, "rank": rank, **MemoryMonitor("cpu").snapshot()}, f)
        return path
    except Exception as e:  # the error report must not fail on a full disk or a broken allocator
        logger.warning(f"could not write the out-of-memory snapshot: {e}")
        return None


def oom_message(e: BaseException, rank: int, step: int, path: str | None) -> str:
    """One line: the rank, the step, the allocator's own first line, the snapshot and what to try."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    first = (lines[0] if lines else type(e).__name__)[:200]
    where = f"memory snapshot {path} (open it at https://pytorch.org/memory_viz)" if path else "no snapshot"
    return (
        f"rank {rank}: out of memory in step {step}: {first}; {where}; lower training.local_batch_size, enable"
        " activation_checkpoint.mode or shard more (parallelism.*)"
    )
