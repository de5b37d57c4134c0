"""Where the training loop lets the host wait for the device, and nowhere else.

Reading a device value on the host (`.item()`, `.cpu()`, `float(t)`) waits until the device has finished all work
queued before it, so the host stops running ahead and the next step starts with an idle GPU. The loop therefore
reads device values only on *check steps*: log steps (step 1, every metrics.log_freq-th, the last), checkpoint
steps, and every step when training.skip_nonfinite_steps is on. Every such read goes through `to_host`, which
counts its calls (tests assert there are none on other steps), and on CUDA the test hook
torchtitan.testing.faults.forbid_syncs turns any synchronization on the other steps into an error
(torch.cuda.set_sync_debug_mode).

`StepChecks` carries what used to need a read and a collective every step:
  * non-finite loss or gradient norm: each step folds it into a device-side "first bad step" (no sync); check
    steps read it, so a NaN is found at the latest at the next check step, and since checkpoint steps are check
    steps, a NaN never reaches a checkpoint (docs/launching.md: "Non-finite losses").
  * preemption: a signal only sets a flag; on check steps all ranks combine both flags in one tiny all-reduce, so
    every rank stops (and saves) at the same step, at most metrics.log_freq steps after the signal.
  * a failed background (async) checkpoint save joins that all-reduce, so every rank reports it at the same check
    step (checkpoint steps are check steps: at the latest when the next save would start).
What those checks stop the run with is defined here too: NonFiniteError (exit 3) and, after the preemption save,
EXIT_PREEMPTED (75).
"""

from __future__ import annotations

import signal

import torch
import torch.distributed as dist

from torchtitan.errors import UserError

EXIT_PREEMPTED = 75  # EX_TEMPFAIL from sysexits.h: "temporary failure, try again" = preempted, resumable

reads = 0  # calls of to_host since the process started


def to_host(*tensors: torch.Tensor) -> list[float]:
    """The values of these scalar tensors on the host, read with one synchronization. They may live on different
    devices (under FSDP CPU offload the gradient norm is computed on the CPU, the loss on the GPU): all are
    gathered on the first one's device first."""
    global reads
    reads += 1
    device = tensors[0].device
    return torch.stack([t.detach().reshape(()).to(device, torch.float64) for t in tensors]).tolist()


class NonFiniteError(UserError):
    """Training produced a NaN/inf loss or gradient norm: stop (one line, exit code 3), write nothing."""

    exit_code = 3


class PreemptionFlag:
    """SIGTERM / SIGUSR1 (what SLURM sends before preemption or the time limit) only set a flag; the trainer checks
    it on check steps (StepChecks.agree), saves, and exits with EXIT_PREEMPTED. A handler never saves by itself:
    the signal can arrive in the middle of a collective, and every rank must save at the same step."""

    def __init__(self):
        self.signum = 0
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        self.signum = signum


class StepChecks:
    """Non-finite detection without a per-step sync, and agreement of all ranks on check steps."""

    def __init__(self, device: torch.device, ignore_nonfinite: bool = False):
        # the first step since the last check whose loss or gradient norm was not finite; 0 = none
        self.first_bad = torch.zeros((), dtype=torch.int64, device=device)
        self.ignore_nonfinite = ignore_nonfinite  # fake-backend simulation: the values are meaningless

    def record(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Every step, on the device: remember the step if its loss or grad norm is NaN/inf (no host read)."""
        if self.ignore_nonfinite:
            return
        bad = ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
        self.first_bad.masked_fill_(bad & (self.first_bad == 0), step)

    def agree(self, signum: int, save_failed: bool = False) -> tuple[int, int, int]:
        """On check steps, on every rank: (first non-finite step on any rank or 0, preemption signal on any rank
        or 0, 1 if a background checkpoint save failed on any rank). One host read and one 3-element all-reduce
        over the world (gloo on CPU tensors)."""
        (first,) = to_host(self.first_bad)
        self.first_bad.zero_()
        # MAX of -first picks the earliest bad step; ranks without one send -inf
        flags = torch.tensor(
            [-first if first else -float("inf"), float(signum), float(save_failed)], dtype=torch.float64
        )
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        first_any, signum_any, failed_any = flags.tolist()
        return (0 if first_any == -float("inf") else int(-first_any)), int(signum_any), int(failed_any)
