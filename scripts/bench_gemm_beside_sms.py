#!/usr/bin/env python
"""How much a training GEMM slows while another kernel holds a few SMs, on one GPU: the question behind the
per-step gap of 8-GPU FSDP runs (docs/estimate_log.md, "The persistent-GEMM reading").

    python scripts/bench_gemm_beside_sms.py --dry-run                  # the GEMMs and what each rule predicts
    python scripts/bench_gemm_beside_sms.py --out /tmp/gs               # on a GPU (docs/performance.md, command g)

An overlapped NCCL collective keeps one resident CTA per channel for as long as it runs (16 on an NVLink ring of
H100s, one or two on a ring over one NIC). Two rules for the compute beside it:
- share: every kernel just loses those SMs, t = W x SMs / (SMs - k) (what the estimator prices);
- static persistent: a GEMM launched as one CTA per SM with its tiles divided in advance (cuBLAS on Hopper:
  pytorch/pytorch#143988, #147966) cannot place k of its CTAs; they start when the holder ends or when the first
  CTAs finish, t = W + min(R, W) for a holder with R seconds left (2x for any k >= 1).
The bench times each GEMM of one transformer block (forward, input gradient, weight gradient of each linear, the
shapes the estimator plans for a published layout) alone and right after a holder kernel of k CTAs that spin for
--hold-ms on another stream, for k in --holders (2: a ring over one NIC; 16: an NVLink ring). It records each
GEMM's kernel and launch grid with torch.profiler (a grid of exactly SMs CTAs is the persistent launch), then plays
the block's whole GEMM sequence beside one holder and compares the two rules' predictions, made from the GEMMs' own
alone times, with what the sequence took. The holder is a Triton kernel (--holder-warps warps per CTA, 16 by
default: 512 threads, like an NCCL CTA) reading %globaltimer; `--holder jiterator` uses torch's NVRTC-compiled
elementwise kernel instead (128 threads per CTA). Each holder's own grid and duration are checked and reported.

Shape sets (--sets): 8b (Llama 3 8B, 1 x 8192 tokens per GPU, FSDP 8: torchao's and torchtitan's 8-GPU rows),
8b-s4096 (1 x 4096: torchao's float8nocompile rows), 70b-tp8 (70B, TP 8, 8 x 8192 per TP group: the async-TP post's
Figure 9), 405b-tp8 (405B, TP 8, 2 x 8192 per TP group: torchtitan's 405B table); --dtypes bf16 (torch.mm with
training's operand layouts) and / or float8 (torch._scaled_mm, tensorwise). Output: a table per set and dtype on
stdout and results.json under --out (rewritten after each).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SETS = {
    "8b": ["--model.flavor=8B", "--training.local_batch_size=1", "--estimate.num_devices=8"],
    "8b-s4096": [
        "--model.flavor=8B",
        "--training.local_batch_size=1",
        "--training.seq_len=4096",
        "--estimate.num_devices=8",
    ],  # fmt: skip
    "70b-tp8": [
        "--model.flavor=70B",
        "--training.local_batch_size=8",
        "--parallelism.tensor_parallel_degree=8",
        "--estimate.num_devices=64",
    ],  # fmt: skip
    "405b-tp8": [
        "--model.flavor=405B",
        "--training.local_batch_size=2",
        "--parallelism.tensor_parallel_degree=8",
        "--estimate.num_devices=128",
    ],  # fmt: skip
}


def block_gemms(name: str) -> list[tuple[str, int, int, int]]:
    """(label, M, N, K) of one block's GEMMs in execution order (forward, then backward in reverse), as the
    estimator plans them for the set's layout: y = x W^T (M = tokens), dx = dy W, dW = dy^T x (K = tokens)."""
    from torchtitan.config import parse_args
    from torchtitan.estimate.plan import build_plan
    from torchtitan.estimate.steptime import _local

    args = ["--training.seq_len=8192", "--estimate.hardware=h100-sxm", *SETS[name]]
    plan = build_plan(parse_args(args), require_rates=False)
    m = int(plan.tokens_per_pass)
    fwd, bwd = [], []
    for lin in plan.block_linears:
        k, n = _local(lin, plan.tp)
        fwd.append((f"{lin.name}.fwd", m, n, k))
        bwd.append([(f"{lin.name}.dgrad", m, k, n), (f"{lin.name}.wgrad", n, k, m)])
    return fwd + [g for pair in reversed(bwd) for g in pair]


def predict(rule: str, times: list[float], hold: float, sms: int, k: int, persistent: list[bool]) -> float:
    """Seconds a GEMM sequence of these alone `times` takes right after a holder of k SMs with `hold` seconds left."""
    wall = 0.0
    for w, pers in zip(times, persistent):
        r = max(hold - wall, 0.0)
        if r <= 0.0 or k == 0:
            wall += w
        elif rule == "static" and pers:
            wall += w + min(r, w)
        else:  # share: the part of w under the holder runs on sms - k SMs
            slow = sms / (sms - k)
            wall += r + (w - r / slow) if w * slow > r else w * slow
    return wall


try:  # Triton resolves a kernel's names in its module's globals: the holder kernel is defined at module level
    import triton
    import triton.language as tl

    @triton.jit
    def _hold(out_ptr, ns):
        # one CTA per program, spinning on %globaltimer for ns nanoseconds
        t0 = tl.inline_asm_elementwise(
            "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
        )
        t = t0
        while t - t0 < ns:
            t = tl.inline_asm_elementwise(
                "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
            )
        tl.store(out_ptr + tl.program_id(0), t - t0)

except ImportError:  # CPU machines: --dry-run needs no Triton
    _hold = None


def make_holder(kind: str, warps: int):
    """A function launching k CTAs that spin for `ns` nanoseconds on the current stream (None: no Triton)."""
    import torch

    if kind == "triton":
        if _hold is None:
            return None
        out = torch.zeros(1024, dtype=torch.int64, device="cuda")

        def launch(k: int, ns: int) -> None:
            _hold[(k,)](out, ns, num_warps=warps)

        return launch
    code = (
        "template <typename T> T hold(T x, T ns) {"
        ' unsigned long long t0, t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0)); t = t0;'
        ' while (t - t0 < (unsigned long long)ns) { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); }'
        " return x; }"
    )
    fn = torch.cuda.jiterator._create_jit_fn(code, ns=0.0)
    per_cta = 512  # jiterator's elementwise launch: 128 threads x 4 elements per CTA

    def launch(k: int, ns: int) -> None:
        fn(torch.zeros(k * per_cta, device="cuda"), ns=float(ns))

    return launch


def kernel_grids(fn, label: str) -> tuple[str, list[int]]:
    """Name and grid of the longest CUDA kernel `fn` launches (torch.profiler's Chrome trace)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.load(open(f.name))["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    if not kernels:
        return f"(no kernel for {label})", []
    top = max(kernels, key=lambda e: e.get("dur", 0))
    return top["name"], list(top.get("args", {}).get("grid", []))


def timed(fn, before=None, repeat: int = 10) -> float:
    """Median seconds of `fn` on the current stream, each time right after `before()` (launched first)."""
    import torch

    out = []
    for i in range(repeat + 2):
        torch.cuda.synchronize()
        if before is not None:
            before()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        if i >= 2:
            out.append(a.elapsed_time(b) / 1e3)
    return statistics.median(out)


def gemm_call(label: str, m: int, n: int, k: int, dtype: str):
    """A call of one GEMM with the operand layouts training gives it: forward x @ W^T, input gradient dy @ W, weight
    gradient dy^T @ x (bf16, torch.mm); float8: torch._scaled_mm with tensorwise scales, row-major x column-major
    as torchao lays its operands out."""
    import torch

    dev = "cuda"
    if dtype == "float8":
        a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=dev)
        return lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)
    bf = torch.bfloat16
    kind = label.rsplit(".", 1)[1]
    if kind == "fwd":
        a, b = torch.randn(m, k, device=dev, dtype=bf), torch.randn(n, k, device=dev, dtype=bf).t()
    elif kind == "dgrad":
        a, b = torch.randn(m, k, device=dev, dtype=bf), torch.randn(k, n, device=dev, dtype=bf)
    else:
        a, b = torch.randn(k, m, device=dev, dtype=bf).t(), torch.randn(k, n, device=dev, dtype=bf)
    return lambda: torch.mm(a, b)


def run_set(
    name: str, holders: list[int], hold_ms: list[float], launch, warps: int, repeat: int, dtype: str
) -> dict:
    import torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    side = torch.cuda.Stream()
    gemms = block_gemms(name)
    calls = {label: gemm_call(label, m, n, k, dtype) for label, m, n, k in gemms}

    def mm(label):
        return calls[label]

    def holder(k: int, ns: int):
        def go():
            if k:  # k = 0: the control, no holder
                with torch.cuda.stream(side):
                    launch(k, ns)

        return go

    rows = []
    for label, m, n, k in gemms:
        kernel, grid = kernel_grids(mm(label), label)
        w = timed(mm(label), repeat=repeat)
        row = {"gemm": label, "M": m, "N": n, "K": k, "alone_ms": w * 1e3, "kernel": kernel, "grid": grid,
               "persistent": math.prod(grid) == sms if grid else None, "beside": []}  # fmt: skip
        for kk in holders:
            for h in hold_ms:
                t = timed(mm(label), before=holder(kk, int(h * 1e6)), repeat=repeat)
                pers = [bool(row["persistent"])]
                row["beside"].append({"k": kk, "hold_ms": h, "ms": t * 1e3,
                                      "static_ms": predict("static", [w], h / 1e3, sms, kk, pers) * 1e3,
                                      "share_ms": predict("share", [w], h / 1e3, sms, kk, pers) * 1e3})  # fmt: skip
        rows.append(row)
    alone = [r["alone_ms"] / 1e3 for r in rows]
    pers = [bool(r["persistent"]) for r in rows]

    def sequence():
        for label, *_ in gemms:
            calls[label]()

    seq = []
    total = timed(sequence, repeat=repeat)
    for kk in holders:
        for h in hold_ms:
            t = timed(sequence, before=holder(kk, int(h * 1e6)), repeat=repeat)
            seq.append({"k": kk, "hold_ms": h, "alone_ms": total * 1e3, "ms": t * 1e3,
                        "static_ms": predict("static", alone, h / 1e3, sms, kk, pers) * 1e3,
                        "share_ms": predict("share", alone, h / 1e3, sms, kk, pers) * 1e3})  # fmt: skip
    # the holders themselves: their grid and how long they hold when alone
    checks = []
    for kk in holders:
        if kk:
            ns = int(hold_ms[0] * 1e6)
            kernel, grid = kernel_grids(holder(kk, ns), "holder")
            # its duration on the current stream (the events bracket it), which should be --hold-ms
            checks.append({"k": kk, "kernel": kernel, "grid": grid,
                           "ms": timed(lambda kk=kk, ns=ns: launch(kk, ns), repeat=3) * 1e3})  # fmt: skip
    calls.clear()
    torch.cuda.empty_cache()
    return {"set": name, "dtype": dtype, "sms": sms, "gemms": rows, "sequence": seq, "holders": checks,
            "holder_warps": warps}  # fmt: skip


def print_set(res: dict) -> None:
    print(f"\n== {res['set']} ({res['dtype']}): {res['sms']} SMs; holders: " + ", ".join(
        f"k={c['k']} grid {c['grid']} {c['ms']:.2f} ms" for c in res["holders"]))  # fmt: skip
    print("| GEMM | M x N x K | grid | alone ms | k | hold ms | beside ms | static rule | share rule |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in res["gemms"]:
        for b in r["beside"]:
            print(
                f"| {r['gemm']} | {r['M']} x {r['N']} x {r['K']} | {r['grid']} | {r['alone_ms']:.3f} | {b['k']} |"
                f" {b['hold_ms']:g} | {b['ms']:.3f} | {b['static_ms']:.3f} | {b['share_ms']:.3f} |"
            )
    for s in res["sequence"]:
        print(
            f"| block sequence | {len(res['gemms'])} GEMMs | | {s['alone_ms']:.3f} | {s['k']} | {s['hold_ms']:g} |"
            f" {s['ms']:.3f} | {s['static_ms']:.3f} | {s['share_ms']:.3f} |"
        )


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", default="8b,405b-tp8", help=f"comma-separated, of {', '.join(SETS)}")
    ap.add_argument("--holders", default="0,2,16", help="CTAs the holder keeps (0: none), comma-separated")
    ap.add_argument("--hold-ms", default="0.5,4", help="how long the holder spins, comma-separated")
    ap.add_argument("--holder", choices=("triton", "jiterator"), default="triton")
    ap.add_argument("--holder-warps", type=int, default=16, help="warps per holder CTA (triton)")
    ap.add_argument(
        "--dtypes", default="bf16", help="bf16 and / or float8 (torch._scaled_mm), comma-separated"
    )
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--out", default=None, help="folder for results.json")
    ap.add_argument("--dry-run", action="store_true", help="list the GEMMs of each set; no GPU needed")
    a = ap.parse_args(argv)
    bad = [s for s in a.sets.split(",") if s not in SETS]
    bad += [d for d in a.dtypes.split(",") if d not in ("bf16", "float8")]
    try:
        a.holders = [int(x) for x in a.holders.split(",")]
        a.hold_ms = [float(x) for x in a.hold_ms.split(",")]
    except ValueError:
        ap.exit(2, f"{ap.prog}: error: --holders takes integers and --hold-ms numbers, comma-separated\n")
    if bad or any(k < 0 for k in a.holders) or any(h <= 0 for h in a.hold_ms):
        what = f"--sets / --dtypes: unknown {', '.join(bad)} (sets: {', '.join(SETS)}; dtypes: bf16, float8)" if bad else (
            "--holders must be >= 0 and --hold-ms > 0")  # fmt: skip
        ap.exit(2, f"{ap.prog}: error: {what}\n")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    sets = a.sets.split(",")
    if a.dry_run:
        for name in sets:
            gemms = block_gemms(name)
            print(f"{name}: {len(gemms)} GEMMs: " + ", ".join(f"{g} {m}x{n}x{k}" for g, m, n, k in gemms))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("bench_gemm_beside_sms: needs a CUDA GPU (use --dry-run to list the GEMMs)", file=sys.stderr)
        return 2
    launch = make_holder(a.holder, a.holder_warps)
    if launch is None:
        print("bench_gemm_beside_sms: --holder triton needs Triton; use --holder jiterator", file=sys.stderr)
        return 2
    results = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "holder": a.holder,
        "sets": [],
    }
    for name in sets:
        for dtype in a.dtypes.split(","):
            res = run_set(name, a.holders, a.hold_ms, launch, a.holder_warps, a.repeat, dtype)
            print_set(res)
            results["sets"].append(res)
            if a.out:
                Path(a.out).mkdir(parents=True, exist_ok=True)
                (Path(a.out) / "results.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
