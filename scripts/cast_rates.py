#!/usr/bin/env python
"""The bandwidth torch's dtype-converting copies reach in one recorded CUDA training step, by direction and shape (the
measurement behind torchtitan/estimate/rates.py's EAGER_UPCAST_FRACTION).

An eager step converts activations between bf16 and fp32 with `aten::copy_` (`.float()`, `.type_as()`, `.to()`):
RoPE's upcast of q and k and its downcast back, their gradients' in backward, the loss's logits. Each such copy on
the compute stream is timed by its kernel (torch.profiler's External id leads from the kernel to the op's recorded
dtypes and shapes); its bytes are the elements read in the source dtype and written in the destination dtype. Only
kernels that no other stream overlapped are counted (a copy beside FSDP's copy-in or a collective shares the
bandwidth); each group's median is its rate.

    python scripts/cast_rates.py TRACE [--peak-gbps 4800]

TRACE is a trainer's CUDA trace (`--profiling.enable_profiling`, <dump>/profile_traces/rank0_stepN.json; a simulated
rank's from scripts/bench_sim_ranks.py --profile-rows). --peak-gbps adds each group's fraction of that bandwidth.
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fsdp_copy_rates import DTYPE_BYTES, trace_arguments  # noqa: E402

from torchtitan.estimate.trace_terms import (  # noqa: E402
    compute_stream,
    device_kernels,
    load_events,
    step_window,
    uncovered,
    union,
)

# the dtypes whose conversions are timed (float8 casts are priced with the float8 casts, not here)
_SHORT = {"float": "fp32", "c10::BFloat16": "bf16", "c10::Half": "fp16", "double": "fp64"}


def cast_rates(path: str | Path) -> list[dict]:
    """One entry per (source dtype, destination dtype, shape, kernel kind): copies, copies alone, bytes of one copy,
    the median seconds of the copies alone."""
    events = load_events(path)
    t0, t1, _ = step_window(events, path)
    kernels = device_kernels(events, t0, t1)
    if not any(k.get("cat") == "kernel" for k in kernels):
        raise ValueError(f"{path}: no CUDA kernels: a CPU trace has no device copies to time")
    compute = compute_stream(kernels)
    others = union([(k["ts"], k["ts"] + k["dur"]) for k in kernels if k["tid"] != compute])
    ops = {e["args"]["External id"]: e for e in events
           if e.get("cat") == "cpu_op" and e["name"] == "aten::copy_" and "External id" in e.get("args", {})}  # fmt: skip
    groups: dict[tuple, dict] = {}
    for k in kernels:
        op = ops.get(k.get("args", {}).get("External id")) if k["tid"] == compute else None
        if op is None:
            continue
        dims, types = op["args"].get("Input Dims") or [], op["args"].get("Input type") or []
        if len(dims) < 2 or len(types) < 2 or not dims[1]:
            continue
        dst, src = types[0], types[1]  # copy_(self, src)
        if src == dst or src not in _SHORT or dst not in _SHORT:
            continue
        kind = (
            "vectorized" if "vectorized" in k["name"] else "unrolled" if "unrolled" in k["name"] else "other"
        )
        key = (_SHORT[src], _SHORT[dst], tuple(dims[1]), kind)
        g = groups.setdefault(key, {"copies": 0, "alone": [], "bytes": math.prod(dims[1]) * (
            DTYPE_BYTES[src] + DTYPE_BYTES[dst])})  # fmt: skip
        g["copies"] += 1
        span = [(k["ts"], k["ts"] + k["dur"])]
        if k["dur"] - uncovered(span, others) < 1e-3:  # nothing beside it (to a nanosecond)
            g["alone"].append(k["dur"] / 1e6)
    return [{"src": s, "dst": d, "shape": list(shape), "kernel": kind, "copies": g["copies"],
             "alone": len(g["alone"]), "bytes": g["bytes"],
             "seconds": statistics.median(g["alone"]) if g["alone"] else None}
            for (s, d, shape, kind), g in sorted(groups.items(), key=lambda x: -x[1]["bytes"] * x[1]["copies"])]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    a = trace_arguments(__doc__, argv)
    try:
        rows = cast_rates(a.trace)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("cast        shape                kernel      copies  alone       MB   median us     GB/s"
          + ("  of peak" if a.peak_gbps else ""))  # fmt: skip
    for r in rows:
        us = r["seconds"] * 1e6 if r["seconds"] else float("nan")
        gbps = r["bytes"] / r["seconds"] / 1e9 if r["seconds"] else float("nan")
        line = (f"{r['src']}->{r['dst']:<5} {'x'.join(map(str, r['shape'])):<20} {r['kernel']:<10} {r['copies']:7d}"
                f" {r['alone']:6d} {r['bytes'] / 1e6:8.1f} {us:11.1f} {gbps:8.0f}")  # fmt: skip
        print(line + (f"  {gbps / a.peak_gbps:7.3f}" if a.peak_gbps else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
