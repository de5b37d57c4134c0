"""How scripts, tests and run_train.sh start the trainer (or any script) on N local processes, the way a user would.

`python -m torchtitan.launch [torchrun options] train.py [overrides]` is torchrun (the same options, run in this
process) with two differences that matter when a run is stopped from outside:

- SIGTERM and SIGUSR1 sent to the launcher go to the workers as they are: the trainer sets its preemption flag,
  saves at the next check step and exits 75, however long the save takes. torchrun itself would raise
  SignalException, send the workers the signal, SIGKILL them after its shutdown timeout (30 s by default, possibly
  in the middle of the save) and exit 1 with a traceback.
- The launcher exits with the workers' exit code when the failed workers agree on one (75 preempted, 2 bad input,
  3 hang or non-finite loss, 4 out of memory: docs/launching.md, "Exit codes"; see exit_code_of); torchrun exits 1
  whatever they said. Failures with different codes still exit 1, with torchrun's failure summary.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

FORWARDED_SIGNALS = ("SIGTERM", "SIGUSR1")


def local_command(nproc: int, script: str, torchrun_args: tuple[str, ...] = ()) -> list[str]:
    """`python script` for one process without torchrun_args, else `torchrun --standalone --nproc_per_node N`."""
    if nproc == 1 and not torchrun_args:
        return [sys.executable, script]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        *torchrun_args,
        script,
    ]


def child_pids(pid: int) -> list[int]:
    """Direct children of `pid` (torchrun's workers are the launcher's): /proc on Linux, else `pgrep -P`."""
    if os.path.isdir("/proc/self"):
        children = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:  # the process ended while we looked
                continue
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after its last ")"
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                children.append(int(entry))
        return children
    r = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(p) for p in r.stdout.split()]


def _forward_to_workers(signum, frame):
    workers = child_pids(os.getpid())
    if not workers:
        # No worker yet (still in the rendezvous): stop the way torchrun does rather than swallow the signal.
        from torch.distributed.elastic.multiprocessing import SignalException

        raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))
    name = signal.Signals(signum).name
    print(f"[launch] {name} received: passed on to the workers {workers}", file=sys.stderr, flush=True)
    for pid in workers:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def exit_code_of(failures: dict) -> int | None:
    """The failed workers' common exit code, or None if they differ. A death by signal N reads 128 + N, as in a
    shell. Workers that died of SIGTERM beside one that exited with a code of its own do not count: torchrun
    SIGTERMs the other workers as soon as the first one ends, and a trainer that has returned from training (after
    the ranks' last barrier, e.g. saved and preempted) no longer handles SIGTERM, so who dies of it is a race."""
    codes = {f.exitcode for f in failures.values()}
    if any(c > 0 for c in codes):
        codes.discard(-signal.SIGTERM)
    codes = {c if c >= 0 else 128 - c for c in codes}
    return codes.pop() if len(codes) == 1 else None


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    from torchtitan.host_sync import EXIT_PREEMPTED

    args = parse_args(argv)
    # torchrun installs a handler for each signal in this list when it starts the workers (its default:
    # SIGTERM,SIGINT,SIGHUP,SIGQUIT); leave ours out of it. (torch versions without the option read the variable.)
    default = os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT")
    handled = [s.strip() for s in getattr(args, "signals_to_handle", default).split(",")]
    kept = ",".join(s for s in handled if s not in FORWARDED_SIGNALS)
    args.signals_to_handle = os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = kept
    for name in FORWARDED_SIGNALS:
        signal.signal(getattr(signal, name), _forward_to_workers)
    try:
        run(args)
    except ChildFailedError as e:
        code = exit_code_of(e.failures)
        if code == EXIT_PREEMPTED:
            print(
                f"[launch] the workers exited {code}: preempted after saving a checkpoint; rerun to resume",
                file=sys.stderr,
            )
            return code
        print(e.format_msg(), file=sys.stderr)
        return code if code else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
