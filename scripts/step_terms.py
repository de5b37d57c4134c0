#!/usr/bin/env python
"""A profiled training step against its estimate, term by term (torchtitan/estimate/trace_terms.py).

    python train.py ... --profiling.enable_profiling=true --profiling.profile_freq=10 --job.dump_folder=out
    python -m torchtitan.estimate ... --estimate.calibrate=true --estimate.json est.json   # same flags (CPU)
    python scripts/step_terms.py out/profile_traces/rank0_step10.json --estimate est.json [--json terms.json]

Prints each term (matmul, attention, elementwise, loss, recompute, communication, optimizer, host) measured in the
trace and estimated, in ms. Without --estimate, the measured terms only. Exit 2 with one line on a bad file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchtitan.estimate.trace_terms import compare, estimated_terms, trace_terms  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace", help="a trainer's profiler trace: <dump>/profile_traces/rank<r>_step<N>.json")
    p.add_argument("--estimate", help="the JSON of `python -m torchtitan.estimate ... --estimate.json F`")
    p.add_argument("--json", help="also write the measured and estimated terms here")
    a = p.parse_args(argv)
    try:
        measured = trace_terms(a.trace)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    estimate = None
    if a.estimate:
        try:
            estimate = json.loads(Path(a.estimate).read_text())
            estimated_terms(estimate), float(estimate["step_time_s"])  # every key the table reads
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"error: --estimate {a.estimate}: not a training estimate's JSON ({e!r})", file=sys.stderr)
            return 2
    print("\n".join(compare(measured, estimate)))
    if a.json:
        Path(a.json).write_text(json.dumps({"measured": measured, "estimate": estimate}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
