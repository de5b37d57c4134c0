#!/usr/bin/env python
"""The bandwidth FSDP2's own copies reach in one recorded CUDA training step, and what the gather copy-in costs the
compute beside it (the measurements behind torchtitan/estimate/rates.py's FSDP_GATHER_COPY_IN_FRACTION,
FSDP_REDUCE_COPY_IN_FRACTION and FSDP_GATHER_COPY_IN_CONTENTION).

torch's fully_shard does three kinds of memory-bound work around its collectives
(torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py):

  gather_copy_in   before each all-gather: the rank's shards cast to the parameter dtype and copied into the flat
                   send buffer (aten::_foreach_copy_ inside FSDP::all_gather: two passes over the shard)
  copy_out         after it: the gathered buffer split into the unsharded parameters (aten::split_with_sizes_copy)
  reduce_copy_in   before each reduce-scatter: the unsharded gradients cast into the flat buffer in the reduce dtype
                   (aten::_chunk_cat)

For each kind this sums the device time of the kernels those ops launched in the step (torch.profiler's
correlation ids) and the bytes they moved: every element read in its source dtype and written in its destination
dtype, the dtypes taken from the kernel's template arguments (chunk_cat_cuda_kernel<dst, src>,
CopyFunctor<dst, src>) or the op's recorded input type, the element counts from the op's recorded input shapes.

The gather copy-in runs on FSDP2's own copy-in stream (FSDPCommContext.all_gather_copy_in_stream, used for the
implicit prefetches of forward and backward), beside the compute; the other two run on the compute stream. What the
copy-in costs the compute it overlaps is measured too (`beside_compute`): each compute-stream kernel that a copy-in
kernel overlaps is compared with the median of its twins (the same kernel name, grid, block and input shapes) that
no other stream overlapped, and its excess is given to the streams beside it in proportion to their overlap; the
copy-in's share, over the copy-in's own device time, is the fraction of it the compute loses
(rates.FSDP_GATHER_COPY_IN_CONTENTION). The compute stream's idle time while a copy-in runs is printed beside it.

    python scripts/fsdp_copy_rates.py TRACE [--peak-gbps 4800]

TRACE is a trainer's CUDA trace (`--profiling.enable_profiling`, <dump>/profile_traces/rank0_stepN.json; a
simulated rank's from scripts/bench_sim_ranks.py --profile-rows). --peak-gbps adds each kind's fraction of that
memory bandwidth (the hardware table's figure for the part).
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchtitan.estimate.trace_terms import (  # noqa: E402
    compute_stream,
    device_kernels,
    load_events,
    step_window,
    uncovered,
    union,
)

DTYPE_BYTES = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "c10::Float8_e4m3fn": 1}
_TEMPLATE_DTYPES = re.compile(r"(?:chunk_cat_cuda_kernel|CopyFunctor|UnaryOpFunctor)<([^,>]+)(?:, ([^,>]+))?")
KINDS = ("gather_copy_in", "copy_out", "reduce_copy_in")


def _kind(op: dict, enclosing: list[str]) -> str | None:
    name = op["name"]
    if name == "aten::_chunk_cat":
        return "reduce_copy_in"
    if name == "aten::split_with_sizes_copy" and any(
        n.startswith("FSDP::all_gather_copy_out") for n in enclosing
    ):
        return "copy_out"
    if name == "aten::_foreach_copy_" and any(n.startswith("FSDP::all_gather") for n in enclosing):
        return "gather_copy_in"
    return None


def _numel(op: dict) -> int:
    dims = op.get("args", {}).get("Input Dims") or [[]]
    first = dims[0]
    tensors = first if first and isinstance(first[0], list) else [first]
    return sum(math.prod(t) for t in tensors if t)


def _element_bytes(op: dict, kernel: str) -> int:
    """Bytes per element a kernel of `op` reads and writes: (source + destination) dtype sizes."""
    m = _TEMPLATE_DTYPES.search(kernel)
    if m:
        dst = DTYPE_BYTES.get(m.group(1).strip())
        src = DTYPE_BYTES.get((m.group(2) or "").strip(), dst)  # UnaryOpFunctor<T, depth, ...>: one dtype
        if dst:
            return dst + src
    recorded = DTYPE_BYTES.get((op.get("args", {}).get("Input type") or [""])[0])
    if recorded:
        return 2 * recorded
    raise ValueError(f"no dtype for {op['name']}'s kernel {kernel[:80]!r}")


def copy_rates(path: str | Path) -> dict[str, dict[str, float]]:
    """Per kind: kernels launched, seconds of device time and bytes moved in the trace's (longest) profiled step."""
    return _copies(load_events(path), path)[0]


def _copies(
    events: list[dict], path: str | Path
) -> tuple[dict[str, dict[str, float]], dict[str, list[dict]]]:
    """copy_rates' sums, and each kind's kernel events."""
    t0, t1, _ = step_window(events, path)
    kernels = {e["args"]["correlation"]: e for e in events
               if e.get("ph") == "X" and e.get("cat") == "kernel" and "correlation" in e.get("args", {})}  # fmt: skip
    if not kernels:
        raise ValueError(f"{path}: no CUDA kernels: a CPU trace has no device copies to time")
    launches = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")
                and e.get("args", {}).get("correlation") in kernels and t0 <= e["ts"] < t1]  # fmt: skip
    spans = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")
             and t0 <= e["ts"] < t1]  # fmt: skip
    out = {k: {"kernels": 0, "seconds": 0.0, "bytes": 0.0} for k in KINDS}
    found: dict[str, list[dict]] = {k: [] for k in KINDS}
    ops = sorted((e for e in spans if e["name"] in ("aten::_chunk_cat", "aten::split_with_sizes_copy",
                                                   "aten::_foreach_copy_")), key=lambda e: e["ts"])  # fmt: skip
    for op in ops:
        end = op["ts"] + op["dur"]
        enclosing = [e["name"] for e in spans if e["tid"] == op["tid"] and e["ts"] <= op["ts"]
                     and e["ts"] + e["dur"] >= end and e is not op]  # fmt: skip
        kind = _kind(op, enclosing)
        if kind is None:
            continue
        mine = [kernels[la["args"]["correlation"]] for la in launches
                if la["tid"] == op["tid"] and op["ts"] <= la["ts"] <= end]  # fmt: skip
        if not mine:
            continue
        found[kind] += mine
        out[kind]["kernels"] += len(mine)
        out[kind]["seconds"] += sum(k["dur"] for k in mine) / 1e6
        out[kind]["bytes"] += _numel(op) * _element_bytes(op, mine[0]["name"])
    return out, found


def beside_compute(path: str | Path) -> dict[str, float]:
    """Seconds of the gather copy-in on its own stream (`copy_in`), of the compute stream's excess it causes
    (`excess`: the module docstring's rule) and of the compute stream's idle time while it runs (`idle`)."""
    events = load_events(path)
    t0, t1, _ = step_window(events, path)
    found = _copies(events, path)[1]["gather_copy_in"]
    kernels = device_kernels(events, t0, t1)
    compute = compute_stream(kernels)
    side = {id(k) for k in found}
    if not side or any(k["tid"] == compute for k in found):
        raise ValueError(f"{path}: no gather copy-in beside the compute stream")
    others = sorted((k["ts"], k["ts"] + k["dur"], id(k) in side) for k in kernels if k["tid"] != compute)
    shapes = {e["args"]["External id"]: str(e["args"].get("Input Dims")) for e in events
              if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}  # fmt: skip
    twins: dict[tuple, list[tuple[float, float, float]]] = {}
    for k in (k for k in kernels if k["tid"] == compute):
        a, b, args = k["ts"], k["ts"] + k["dur"], k.get("args", {})
        by_copy_in = by_other = 0.0
        for x, y, copy_in in others:
            if x < b and y > a:
                o = min(b, y) - max(a, x)
                by_copy_in, by_other = (by_copy_in + o, by_other) if copy_in else (by_copy_in, by_other + o)
        key = (k["name"], str(args.get("grid")), str(args.get("block")), shapes.get(args.get("External id")))
        twins.setdefault(key, []).append((k["dur"], by_copy_in, by_other))
    excess = 0.0
    for runs in twins.values():
        alone = [d for d, c, o in runs if c + o == 0]
        if not alone:
            continue
        base = statistics.median(alone)
        excess += sum((d - base) * c / (c + o) for d, c, o in runs if c > 0)
    copy_in = [(k["ts"], k["ts"] + k["dur"]) for k in found]
    ran = [(k["ts"], k["ts"] + k["dur"]) for k in kernels if k["tid"] == compute]
    idle = uncovered(union(copy_in), union(ran))
    return {"copy_in": sum(b - a for a, b in copy_in) / 1e6, "excess": excess / 1e6, "idle": idle / 1e6}


def trace_arguments(doc: str, argv: list[str] | None) -> argparse.Namespace:
    """A trace script's command line: TRACE and --peak-gbps, described by the first paragraph of `doc`."""
    p = argparse.ArgumentParser(
        description=doc.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("trace", help="a trainer's CUDA profiler trace (<dump>/profile_traces/rank0_stepN.json)")
    p.add_argument("--peak-gbps", type=float, default=None, help="the part's memory bandwidth, GB/s")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = trace_arguments(__doc__, argv)
    try:
        rates = copy_rates(a.trace)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("kind              kernels        GB        ms     GB/s" + ("  of peak" if a.peak_gbps else ""))
    for kind, r in rates.items():
        gbps = r["bytes"] / r["seconds"] / 1e9 if r["seconds"] else float("nan")
        line = f"{kind:<16} {r['kernels']:8d} {r['bytes'] / 1e9:9.2f} {r['seconds'] * 1e3:9.2f} {gbps:8.0f}"
        print(line + (f"  {gbps / a.peak_gbps:7.3f}" if a.peak_gbps else ""))
    try:
        side = beside_compute(a.trace)
    except ValueError as e:  # every copy on the compute stream: nothing beside it to measure
        print(f"gather copy-in beside the compute: {e}")
        return 0
    print(
        f"gather copy-in beside the compute: {side['copy_in'] * 1e3:.2f} ms on its stream; the compute's excess"
        f" beside it {side['excess'] * 1e3:.2f} ms ({side['excess'] / side['copy_in']:.3f} of it);"
        f" the compute stream idle meanwhile {side['idle'] * 1e3:.2f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
