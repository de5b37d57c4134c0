"""torch.profiler traces on a fixed cadence: one step recorded every `profiling.profile_freq` steps, per rank."""

from __future__ import annotations

import os

import torch

from torchtitan.log import logger


class Profiler:
    """Call `step()` after every training step and `stop()` at the end; does nothing unless enabled.

    Each cycle of profile_freq steps waits, warms up for one step and records the last one; the trace goes to
    <dump>/<save_traces_folder>/rank<r>_step<N>.json (open it in Perfetto or chrome://tracing).
    """

    def __init__(self, cfg, rank: int, dump_folder: str, start_step: int = 0):
        p = cfg.profiling
        self.step_num = start_step
        self.prof = None
        if not p.enable_profiling:
            return
        self.folder = os.path.join(dump_folder, p.save_traces_folder)
        os.makedirs(self.folder, exist_ok=True)
        self.rank = rank
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        warmup = 1 if p.profile_freq > 1 else 0
        self.prof = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=p.profile_freq - 1 - warmup, warmup=warmup, active=1),
            on_trace_ready=self._save,
            record_shapes=True,
        )
        self.prof.start()

    def _save(self, prof) -> None:
        path = os.path.join(self.folder, f"rank{self.rank}_step{self.step_num}.json")
        prof.export_chrome_trace(path)
        logger.info("profiler trace written to %s", path)

    def step(self) -> None:
        if self.prof is not None:
            self.step_num += 1
            self.prof.step()

    def stop(self) -> None:
        if self.prof is not None:
            self.prof.stop()
