"""Where the wall clock went: every second since the job first started, attributed to one part.

The tracker only counts seconds with the host clock (no device sync, no collective); the goodput/* tags are
derived from its counters in metrics/processor.py (definitions: docs/metrics.md, "Goodput").

    wall = now - the moment the job's first process started (persisted, so it spans restarts)
         = init + checkpoint_load + warmup + productive + data + lost + checkpoint_save + validation + restart

Within one process the parts are exhaustive by construction: time is either inside a named phase
(`with tracker.phase("validation"): ...`), or in the background, which is "init" until training starts and
then belongs to the step in progress, whose time `step_done` splits into data wait and the step's category
(warmup for the first step of a process, lost for a step an earlier process had already run, else productive).
Across restarts the counters continue from the newest record of the earlier processes: the progress file
(`<job.dump_folder>/goodput.json`, written by rank 0 on log steps, at saves and at the end) or, without it,
the checkpoint's train_state; the time from that record to this process's start (the crashed process's
unrecorded tail, the scheduler's restart delay) is `restart`.
"""

from __future__ import annotations

import contextlib
import json
import os
import time

from torchtitan.log import logger

PARTS = (
    "init",
    "checkpoint_load",
    "warmup",
    "productive",
    "data",
    "lost",
    "checkpoint_save",
    "validation",
    "restart",
)
PROGRESS_FILE = "goodput.json"
_IMPORT_UNIX = time.time()


def process_start_unix() -> float:
    """Unix time at which this process started (Linux /proc, 10 ms resolution), so the interpreter's start and
    the imports count as initialization; elsewhere the import of this module."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the command name may contain spaces: split after it
        start_ticks = int(fields[19])  # field 22, starttime, in clock ticks after boot (proc(5))
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - max(age, 0.0)
    except (OSError, ValueError, IndexError, AttributeError):
        return _IMPORT_UNIX


class GoodputTracker:
    """Counts seconds per part for this process and carries the earlier processes' counts.

    `progress_path`: the per-job progress file, or None when nothing is resumed (checkpointing off): every run
    is then a new job. Only rank `0` writes it; every rank reads it when resuming.
    """

    def __init__(self, progress_path: str | None, rank: int):
        self.progress_path, self.rank = progress_path, rank
        self.attempt_start_unix = process_start_unix()
        # perf_counter's value at the process start: from here on every interval is measured with perf_counter
        self._mark = time.perf_counter() - (time.time() - self.attempt_start_unix)
        self._pending = 0.0  # background seconds not yet given to a part
        self._phase: str | None = None  # the phase in progress; it started at self._mark
        self.job_start_unix = self.attempt_start_unix
        self.earlier = dict.fromkeys(PARTS, 0.0)  # earlier processes of this job, plus the restart gap
        self.now = dict.fromkeys(PARTS, 0.0)  # this process
        self.phase_seconds = 0.0  # this process's time inside phases: the step timer leaves it out
        self.restarts = 0
        self.lost_steps = 0  # over the whole job
        self.furthest_step = 0  # the furthest step any process of this job reached (on a log step or save)
        self._redo_until = 0  # steps up to here were already run by an earlier process: re-doing them is lost
        self._first_step: int | None = None  # None until training starts
        self._step = 0  # the last step this process finished
        self._checkpoint_state: dict | None = None
        self._progress_warned = False  # the progress file could not be written (said once)

    # ---- timing --------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def phase(self, part: str):
        """Attribute the time inside the block to `part` (checkpoint_load, checkpoint_save, validation)."""
        start = time.perf_counter()
        self._pending += start - self._mark
        self._mark, self._phase = start, part
        try:
            yield
        finally:
            end = time.perf_counter()
            self.now[part] += end - start
            self.phase_seconds += end - start
            self._mark, self._phase = end, None

    def _take_background(self) -> float:
        t = time.perf_counter()
        seconds, self._pending, self._mark = self._pending + t - self._mark, 0.0, t
        return seconds

    def _category(self, step: int) -> str:
        if step <= self._redo_until:
            return "lost"
        return "warmup" if step == self._first_step else "productive"

    def start_training(self, start_step: int) -> None:
        """End of initialization: continue an earlier process's counters if this job has any."""
        self.now["init"] += self._take_background()
        self._first_step, self._step = start_step + 1, start_step
        self._resume(start_step)

    def step_done(self, step: int, data_s: float) -> None:
        """Close step `step`: its time since the previous step (phases excluded) minus `data_s` goes to its
        category, `data_s` to data (a re-done step is lost as a whole)."""
        seconds = self._take_background()
        part = self._category(step)
        if part == "lost":
            self.now["lost"] += seconds
            self.lost_steps += 1
        else:
            data = min(max(data_s, 0.0), seconds)
            self.now["data"] += data
            self.now[part] += seconds - data
        self.furthest_step = max(self.furthest_step, step)
        self._step = step

    def snapshot(self) -> dict:
        """Counters of the whole job up to now (the step in progress counted in its category) and the wall time."""
        parts = {p: self.earlier[p] + self.now[p] for p in PARTS}
        since_mark = time.perf_counter() - self._mark
        background = self._pending
        if self._phase is None:
            background += since_mark
        else:
            parts[self._phase] += since_mark
        parts["init" if self._first_step is None else self._category(self._step + 1)] += background
        return {
            "job_start_unix": self.job_start_unix,
            "wall_s": time.time() - self.job_start_unix,
            "parts": parts,
            "lost_steps": self.lost_steps,
            "restarts": self.restarts,
            "furthest_step": self.furthest_step,
        }

    # ---- persistence: the checkpoint's train_state and the progress file ----------------------------------

    def state_dict(self) -> dict:
        """What a checkpoint keeps (in each rank's train_state JSON)."""
        snap = self.snapshot()
        return {
            "job_start_unix": snap["job_start_unix"],
            "saved_unix": time.time(),
            "parts": snap["parts"],
            "lost_steps": snap["lost_steps"],
            "restarts": snap["restarts"],
            "furthest_step": snap["furthest_step"],
        }

    def load_state_dict(self, sd: dict) -> None:
        """Called by the checkpoint load; used by start_training when no newer progress file exists."""
        self._checkpoint_state = sd

    def save_progress(self, finished: bool = False) -> None:
        """Rank 0: write the progress file atomically (log steps, saves, the end)."""
        if self.progress_path is None or self.rank != 0:
            return
        record = {**self.state_dict(), "finished": finished}
        tmp = f"{self.progress_path}.tmp"
        try:
            os.makedirs(os.path.dirname(self.progress_path) or ".", exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(record, f)
            os.replace(tmp, self.progress_path)
        except OSError as e:
            # A bookkeeping file must not stop training (a full disk is the checkpoint's to report, with its
            # advice); the checkpoint carries the same counters, so a restart still continues them.
            if not self._progress_warned:
                logger.warning(
                    f"goodput: cannot write {self.progress_path} ({e.strerror or e}); going on without it"
                )
                self._progress_warned = True
            with contextlib.suppress(OSError):
                os.remove(tmp)

    def _read_progress(self) -> dict | None:
        if self.progress_path is None:
            return None
        try:
            with open(self.progress_path, encoding="utf-8") as f:
                record = json.load(f)
            return record if isinstance(record, dict) and "parts" in record else None
        except (OSError, ValueError):
            return None  # absent or torn: fall back to the checkpoint's copy

    def _resume(self, start_step: int) -> None:
        progress = self._read_progress()
        ckpt = self._checkpoint_state
        source = None
        if progress is not None and not (progress.get("finished") and start_step == 0):
            # A finished job's file and no checkpoint to resume from: this is a new job in an old folder.
            if ckpt is None or progress["job_start_unix"] == ckpt["job_start_unix"]:
                source = progress  # the newest record of this job
        if source is None and ckpt is not None:
            source = ckpt
        if source is None:
            return  # a new job
        self.job_start_unix = source["job_start_unix"]
        self.earlier = {p: float(source["parts"].get(p, 0.0)) for p in PARTS}
        self.earlier["restart"] += max(0.0, self.attempt_start_unix - source["saved_unix"])
        self.restarts = int(source["restarts"]) + 1
        self.lost_steps = int(source["lost_steps"])
        self.furthest_step = max(int(source["furthest_step"]), start_step)
        self._redo_until = int(source["furthest_step"])
