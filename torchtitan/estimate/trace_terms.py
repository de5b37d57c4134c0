"""One recorded training step, summed by the estimator's own terms: which term of an estimate is wrong, not only
whether the total is.

An estimate's step is the sum of terms (`training_step_time`: matmul, attention, elementwise, loss and float8 casts
of compute, recompute under AC, exposed communication, the optimizer, a pipeline bubble). A total can agree with a
measured step while two of its terms are wrong in opposite directions; the validation table only sees totals. This
reads one torch.profiler trace of the trainer (`--profiling.enable_profiling=true`: <dump>/profile_traces/
rank<r>_step<N>.json, one step between its `ProfilerStep#` marks) and sums the step's time into the same terms:

  CPU trace (no device kernels): the main thread's time inside the step, each instant given to the innermost event
      running then (an op's self time: its duration less its children's); time inside no event is `host`.
  CUDA trace: device kernels, each given the term of the CPU ops that launched it (its correlation id leads to the
      launch, the launch to the events around it on its thread) and of its own name; communication counts only
      where no other kernel ran (exposed); time with no kernel running in the step is `host` (the device waited).

Terms, first match from the innermost event outwards (ops are named as torch.profiler names them):
  optimizer      inside `Optimizer.step` / `Optimizer.zero_grad`, and gradient clipping's norms
  communication  c10d collectives and everything inside them (the fake backend's stand-in copies), NCCL kernels,
                 DTensor's redistribute, FSDP2's hooks (their waits on the collectives: on CPU gloo runs on its own
                 threads and the main thread waits inside these)
  attention      scaled_dot_product_attention and its flash / efficient / cuDNN kernels
  loss           log-softmax, NLL, cross-entropy
  matmul         mm, addmm, bmm, baddbmm, _scaled_mm (and GEMM kernels by name)
  elementwise    every other aten op and kernel that works on data (norms, activations, casts, adds, FSDP2's
                 copy-in / copy-out)
                 (on CPU, time inside a compiled graph but in no aten op: Inductor's generated kernels, which
                 fuse the norms, activations and a compiled loss)
  host           the rest of the step: autograd's and the Python wrappers' own time, ops that only make views or
                 allocate, the own time of composites (linear, _to_copy) and of DTensor's dispatch, gaps between ops
The estimator has no host term on CPU or GPU; its recompute is priced as its own line while a trace shows the
recomputed forward ops under their own terms. `compare()` puts both side by side (docs/estimate.md, "A step's
terms against a trace").
"""

from __future__ import annotations

import heapq
import json
import re
from pathlib import Path

TERMS = ("matmul", "attention", "elementwise", "loss", "communication", "optimizer", "host")

_OPTIMIZER = re.compile(r"^Optimizer\.(step|zero_grad)#|linalg_vector_norm|_foreach_norm")
# op and annotation names (torch.profiler's cpu_op / user_annotation events)
# the collective ops themselves: everything inside one is communication, an aten op there too (the collective's own
# work: the fake backend's stand-in copies of `--comm.mode=fake_backend`, a CPU backend's buffer copies)
_COLLECTIVE = re.compile(r"^(c10d::|_c10d_functional::|c10d_functional::|record_param_comms)")
# what waits on collectives without being one: communication only outside any aten op (their copies are elementwise)
_COMM = re.compile(r"^(Redistribute|FSDP::)|RegisterPostBackward|wait_tensor")
_ATTENTION = re.compile(r"^aten::_?(scaled_dot_product|flash_attention|efficient_attention|cudnn_attention)")
_LOSS = re.compile(r"^aten::(_log_softmax|log_softmax|_log_softmax_backward_data|nll_loss|cross_entropy)")
_MATMUL = re.compile(r"^aten::(mm|addmm|bmm|baddbmm|_scaled_mm|_addmm_activation)$")
_ASYNC = re.compile(r"^(gloo|nccl):")
_COMPILED = re.compile(r"^## Call CompiledFxGraph|^Torch-Compiled Region")
# device kernel names (CUDA: cuBLAS, CUTLASS, FlashAttention, cuDNN, PyTorch's own and Triton's fused kernels)
_K_COMM = re.compile(r"nccl", re.IGNORECASE)
_K_ATTENTION = re.compile(r"flash|fmha|sdpa|attention", re.IGNORECASE)
_K_LOSS = re.compile(r"log_softmax|nll_loss|cross_entropy|cunn_SoftMax", re.IGNORECASE)
_K_MATMUL = re.compile(r"gemm|cutlass|nvjet|xmma|cublas|wgmma", re.IGNORECASE)


# aten ops that only make views or allocate: their time is dispatch, not work on the data
_METADATA = re.compile(r"^aten::(view|_unsafe_view|as_strided|t|transpose|reshape|_reshape_alias|unsqueeze|squeeze"
                       r"|slice|select|narrow|expand|expand_as|permute|alias|detach|empty|empty_strided|empty_like"
                       r"|split|split_with_sizes|chunk|unbind|unflatten|flatten|lift_fresh|resolve_conj"
                       r"|resolve_neg|is_same_size|result_type|_local_scalar_dense|item)$")  # fmt: skip
# aten ops whose work is done by the aten ops they call: their own time is dispatch
_COMPOSITE = re.compile(r"^aten::(linear|matmul|to|_to_copy|type_as|contiguous|reshape|flatten|rms_norm"
                        r"|_fused_rms_norm|layer_norm|square|einsum|dropout|repeat_interleave)$")  # fmt: skip


def classify(stack: list[str], kernel: str | None = None, subclass: bool = False) -> str:
    """The term of an instant whose enclosing events are `stack` (outermost first) and, on a device, `kernel`
    (its name; None for a CPU trace). From the innermost event outwards: a compute op decides; an aten op that is
    none of them is elementwise unless an op around it is (aten::copy_ inside cross-entropy is the loss's); a
    redistribute or FSDP hook decides only for time not inside an aten op (the wait), a c10d collective op for
    everything inside it (its own work: the fake backend's stand-in copies). On a CPU the
    own time of an op that only makes views or allocates, of a composite whose work its inner ops do (linear,
    _to_copy, the CPU's composite RMSNorm, ...) and of a tensor subclass's op that calls the same op (or Python)
    for its local tensor (`subclass`: DTensor's sharding propagation) is `host`."""
    if any(_OPTIMIZER.search(n) for n in stack):
        return "optimizer"
    if kernel is None and stack and stack[-1].startswith("aten::"):
        if _METADATA.search(stack[-1]) or _COMPOSITE.search(stack[-1]) or subclass:
            return "host"
    if kernel is not None:
        for pattern, term in ((_K_COMM, "communication"), (_K_ATTENTION, "attention"), (_K_LOSS, "loss"),
                              (_K_MATMUL, "matmul")):  # fmt: skip
            if pattern.search(kernel):
                return term
    if any(_COLLECTIVE.search(n) for n in stack):
        return "communication"
    inside_op = kernel is not None  # a kernel is device work: elementwise unless something says otherwise
    for name in reversed(stack):
        for pattern, term in ((_ATTENTION, "attention"), (_LOSS, "loss"), (_MATMUL, "matmul")):
            if pattern.search(name):
                return term
        if _COMM.search(name) and not inside_op:
            return "communication"
        if _COMPILED.search(name) and not inside_op:
            return "elementwise"  # Inductor's generated CPU kernels are no ops: the fused norms, activations, loss
        inside_op = inside_op or name.startswith("aten::")
    return "elementwise" if inside_op else "host"


def load_events(path: str | Path) -> list[dict]:
    """A torch.profiler Chrome trace's events (ValueError naming the file if it is not one)."""
    try:
        return json.loads(Path(path).read_text())["traceEvents"]
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"{path}: not a torch.profiler Chrome trace ({e})") from None


def step_window(events: list[dict], path) -> tuple[float, float, object]:
    """The recorded step (the longest `ProfilerStep#` mark): its start and end, in us, and its thread."""
    steps = [e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")]
    if not steps:
        raise ValueError(
            f"{path}: no ProfilerStep# event: record it with the trainer's --profiling.enable_profiling"
        )
    s = max(steps, key=lambda e: e["dur"])
    return float(s["ts"]), float(s["ts"]) + float(s["dur"]), s["tid"]


def _nest(
    events: list[dict], points: list[float] = ()
) -> tuple[list[tuple[list[str], bool]], list[list[str]]]:
    """One thread's events as a nesting: for each event its stack (outermost first, itself last) and whether it
    calls the same op or Python (a tensor subclass's op); for each instant in `points`, the stack of events around
    it."""
    order = sorted(range(len(events)), key=lambda i: (events[i]["ts"], -events[i]["dur"]))
    pts = sorted(range(len(points)), key=lambda i: points[i])
    again = [False] * len(events)  # the same op (or Python) inside it: a tensor subclass's dispatch (DTensor)
    names: list[list[str]] = [[] for _ in events]
    at: list[list[str]] = [[] for _ in points]
    stack: list[int] = []  # indices of the open events, outermost first
    j = 0

    def pop_until(t: float) -> None:
        while stack and events[stack[-1]]["ts"] + events[stack[-1]]["dur"] <= t:
            stack.pop()

    for i in order:
        e = events[i]
        while j < len(pts) and points[pts[j]] < e["ts"]:
            pop_until(points[pts[j]])
            at[pts[j]] = [events[k]["name"] for k in stack]
            j += 1
        pop_until(e["ts"])
        if stack:
            again[stack[-1]] = again[stack[-1]] or e["name"] in (events[stack[-1]]["name"], "PythonSubclass")
        stack.append(i)
        names[i] = [events[k]["name"] for k in stack]
    for k in pts[j:]:
        pop_until(points[k])
        at[k] = [events[m]["name"] for m in stack]
    return [(names[i], again[i]) for i in range(len(events))], at


def _thread_events(events: list[dict], tid) -> list[dict]:
    """The ops and annotations of one thread, without the step's mark and the communication libraries' records of
    asynchronous work (`gloo:` / `nccl:`: an isend's record lasts until its peer received it): not the thread's
    time, and they need not nest."""
    return [e for e in events if e.get("ph") == "X" and e.get("tid") == tid and e.get("cat") in ("cpu_op",
            "user_annotation") and not str(e["name"]).startswith("ProfilerStep#")
            and not _ASYNC.search(str(e["name"]))]  # fmt: skip


def _own_times(events: list[dict], t0: float, t1: float) -> tuple[list[float], float]:
    """Each event's own time in [t0, t1), in us: every instant goes to the innermost event running then (the latest
    to start; of two, the shorter), so that the times add up to the window even where a record does not nest
    (an event that ends after its parent); and the time inside no event."""
    own = [0.0] * len(events)
    starts = sorted(range(len(events)), key=lambda i: events[i]["ts"])
    bounds = sorted(
        {t0, t1, *(min(t1, max(t0, e["ts"] + e["dur"])) for e in events), *(e["ts"] for e in events)}
    )
    active: list[tuple[float, float, int]] = []  # (-start, duration, index): the innermost on top
    j, idle = 0, 0.0
    for a, b in zip(bounds, bounds[1:]):
        while j < len(starts) and events[starts[j]]["ts"] <= a:
            e = events[starts[j]]
            heapq.heappush(active, (-e["ts"], e["dur"], starts[j]))
            j += 1
        while active and events[active[0][2]]["ts"] + events[active[0][2]]["dur"] <= a:
            heapq.heappop(active)  # ended: an ended event below the top surfaces (and goes) later
        if active:
            own[active[0][2]] += b - a
        else:
            idle += b - a
    return own, idle


def _cpu_terms(events: list[dict], t0: float, t1: float, tid) -> dict[str, float]:
    """Seconds of the main thread in the step by term: each event's own time under its stack's term."""
    evs = [e for e in _thread_events(events, tid) if t0 <= e["ts"] < t1]
    out = dict.fromkeys(TERMS, 0.0)
    nested, _ = _nest(evs)
    own, idle = _own_times(evs, t0, t1)
    for (stack, subclass), us in zip(nested, own):
        out[classify(stack, subclass=subclass)] += us / 1e6
    out["host"] += idle / 1e6  # inside no event: Python between ops, waits outside ops
    return out


def device_kernels(events: list[dict], t0: float, t1: float) -> list[dict]:
    """The device work that starts inside [t0, t1): kernels, memcpys and memsets."""
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
            and t0 <= e["ts"] < t1]  # fmt: skip


def compute_stream(kernels: list[dict]) -> object:
    """The stream (its trace tid) with the most device time among `kernels`: the compute stream."""
    busy: dict[object, float] = {}
    for k in kernels:
        busy[k["tid"]] = busy.get(k["tid"], 0.0) + k["dur"]
    return max(busy, key=busy.get)


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The intervals merged into sorted, disjoint ones."""
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _length(intervals) -> float:
    return sum(b - a for a, b in intervals)


def uncovered(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of the union `a` outside the union `b` (both merged and sorted)."""
    covered, j = 0.0, 0
    for x0, x1 in a:
        while j < len(b) and b[j][1] <= x0:
            j += 1
        k = j
        while k < len(b) and b[k][0] < x1:
            covered += min(x1, b[k][1]) - max(x0, b[k][0])
            k += 1
    return _length(a) - covered


def _cuda_terms(events: list[dict], t0: float, t1: float) -> dict[str, float]:
    kernels = [
        e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    ]
    launches = {e["args"]["correlation"]: e for e in events if e.get("ph") == "X" and e.get("cat") in
                ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}  # fmt: skip
    by_term: dict[str, list[tuple[float, float]]] = {t: [] for t in TERMS}
    mine = [(k, launches[k["args"]["correlation"]]) for k in kernels
            if k.get("args", {}).get("correlation") in launches]  # fmt: skip
    mine = [(k, launch) for k, launch in mine if t0 <= launch["ts"] < t1]  # launched inside the step
    for tid in {launch["tid"] for _, launch in mine}:
        here = [(k, launch) for k, launch in mine if launch["tid"] == tid]
        _, stacks = _nest(_thread_events(events, tid), [launch["ts"] for _, launch in here])
        for (k, _), stack in zip(here, stacks):
            term = classify(stack, k["name"] if k.get("cat") == "kernel" else "memcpy")
            by_term[term].append((k["ts"], k["ts"] + k["dur"]))
    out = dict.fromkeys(TERMS, 0.0)
    compute = union([iv for t, ivs in by_term.items() if t != "communication" for iv in ivs])
    for t, ivs in by_term.items():
        if t != "communication":
            out[t] = sum(b - a for a, b in ivs) / 1e6
    out["communication"] = uncovered(union(by_term["communication"]), compute) / 1e6  # exposed only
    busy = union([iv for ivs in by_term.values() for iv in ivs])
    out["host"] = uncovered([(t0, t1)], busy) / 1e6  # the device idle inside the step
    return out


def trace_terms(path: str | Path) -> dict:
    """The recorded step's seconds by term (`terms`), its length (`step_s`) and the trace's kind (`device`)."""
    events = load_events(path)
    t0, t1, tid = step_window(events, path)
    cuda = any(e.get("cat") == "kernel" for e in events)
    terms = _cuda_terms(events, t0, t1) if cuda else _cpu_terms(events, t0, t1, tid)
    return {"device": "cuda" if cuda else "cpu", "step_s": (t1 - t0) / 1e6, "terms": terms}


def estimated_terms(estimate: dict) -> dict[str, float]:
    """An estimate's (the JSON of `python -m torchtitan.estimate`) step in the same terms; recompute is its own.
    The model prices no host time; where a CPU calibration timed the trainer's own step on this plan, what that
    measurement holds beyond the model's terms (`measured_beyond_model`, of either sign) stands in the host's row,
    so the terms still add up to the step."""
    d, b = estimate["compute_detail_s"], estimate["step_time_breakdown_s"]
    return {
        "matmul": d["matmul"],
        "attention": d["attention"],
        "elementwise": d["elementwise"] + d.get("float8_casts", 0.0),
        "loss": d["loss"],
        "recompute": b.get("recompute", 0.0),
        "communication": sum(v for k, v in b.items() if k.endswith("_comm_exposed"))
        + b.get("pipeline_bubble", 0.0),
        "optimizer": b["optimizer"],
        "host": b.get("measured_beyond_model", 0.0),
        "straggler": b.get("straggler", 0.0),
    }


def compare(measured: dict, estimate: dict | None) -> list[str]:
    """Lines of a table: each term measured, estimated and their difference (estimated - measured), in ms."""
    est = estimated_terms(estimate) if estimate else {}
    m = measured["terms"]
    lines = [f"{'term':<14} {'measured ms':>12} {'estimated ms':>13} {'est - meas':>11}"]
    for term in (*TERMS[:4], "recompute", *TERMS[4:], "straggler"):
        if term not in m and not est.get(term):
            continue
        mv = m.get(term)
        ev = est.get(term)
        cells = [f"{mv * 1e3:12.1f}" if mv is not None else f"{'(in terms)':>12}",
                 f"{ev * 1e3:13.1f}" if ev is not None else f"{'':>13}",
                 f"{(ev - (mv or 0.0)) * 1e3:+11.1f}" if ev is not None else ""]  # fmt: skip
        lines.append(f"{term:<14} " + " ".join(cells))
    total_e = estimate["step_time_s"] if estimate else None
    lines.append(f"{'step':<14} {measured['step_s'] * 1e3:12.1f}"
                 + (f" {total_e * 1e3:13.1f} {(total_e - measured['step_s']) * 1e3:+11.1f}" if total_e else ""))  # fmt: skip
    if measured["device"] == "cpu":
        lines.append("(CPU: the main thread's time; communication = its waits inside collectives, redistributes"
                     " and FSDP2's hooks)")  # fmt: skip
    else:
        lines.append(
            "(CUDA: kernel time; communication = NCCL time no other kernel overlapped; host = device idle)"
        )
    return lines
