"""Where the test suite's CPU goes: a pytest plugin that records each test's wall time and the CPU (user + sys) of
pytest's own process and of the child processes it waited for, and a summary of the records by file.

    PYTHONPATH=scripts CPU_TIMES_DIR=/tmp/cpu ./scripts/test.sh -p pytest_cpu_times -q   # one JSON line per test
    python scripts/pytest_cpu_times.py /tmp/cpu [--top 30]                                # by file, then by test

Each pytest process (each pytest-xdist worker) appends to its own file, cpu_<worker>.jsonl. "self" is the process's
own CPU over the test (all its threads: a test that leaves a thread spinning charges the tests after it); "children"
counts a child only once it was waited for, so a module-scoped run is charged to the test that built it, and work
done outside pytest's tree (SLURM's jobs) is not counted. CPU time moves less with the machine's load than wall time.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import sys
import time
from pathlib import Path

import pytest


def _cpu() -> tuple[float, float]:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    folder = Path(os.environ.get("CPU_TIMES_DIR", "cpu_times"))
    started, (own, kids) = time.perf_counter(), _cpu()
    yield
    own2, kids2 = _cpu()
    folder.mkdir(parents=True, exist_ok=True)
    row = {
        "id": item.nodeid,
        "wall": time.perf_counter() - started,
        "self": own2 - own,
        "children": kids2 - kids,
    }
    # pytest-xdist's worker id from the config, not the environment, which a pytest started by a test inherits
    worker = getattr(item.config, "workerinput", {}).get("workerid", "main")
    with open(folder / f"cpu_{worker}.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


def summary(folder: Path, top: int) -> str:
    rows = [
        json.loads(line)
        for path in sorted(folder.glob("cpu_*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    by_file = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    for r in rows:
        f = by_file[r["id"].split("::")[0]]
        f[0], f[1], f[2], f[3] = f[0] + r["self"], f[1] + r["children"], f[2] + r["wall"], f[3] + 1
    total = sum(own + kids for own, kids, _, _ in by_file.values())
    out = [
        f"{len(rows)} tests, {total:.0f} CPU-s ({sum(r['wall'] for r in rows):.0f} s of test time summed)",
        "",
    ]
    out.append(f"{'CPU-s':>7} {'self':>6} {'wall s':>7} {'tests':>5}  file")
    for name, (own, kids, wall, n) in sorted(by_file.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))[:top]:
        out.append(f"{own + kids:7.0f} {own:6.0f} {wall:7.0f} {n:5d}  {name}")
    out += ["", f"{'CPU-s':>7} {'self':>6} {'wall s':>7}  test"]
    for r in sorted(rows, key=lambda r: -(r["self"] + r["children"]))[:top]:
        out.append(f"{r['self'] + r['children']:7.0f} {r['self']:6.0f} {r['wall']:7.0f}  {r['id']}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(
        description="Summarize the CPU times recorded by this plugin (see the module doc)."
    )
    ap.add_argument("folder", type=Path, help="the CPU_TIMES_DIR of the run")
    ap.add_argument("--top", type=int, default=30, help="files and tests to list (default 30)")
    a = ap.parse_args()
    if not list(a.folder.glob("cpu_*.jsonl")):
        print(
            f"error: no cpu_*.jsonl in {a.folder}; run pytest with -p pytest_cpu_times first", file=sys.stderr
        )
        sys.exit(2)
    print(summary(a.folder, a.top))


if __name__ == "__main__":
    main()
