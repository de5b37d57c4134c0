#!/usr/bin/env python
"""How much memory-bound kernels slow while another stream moves data through the GPU's memory, on one GPU: the
check of the bandwidth share the estimator gives compute beside a ring (collectives.overlap_hbm_share).

    python scripts/bench_bandwidth_beside_ring.py --dry-run           # the kernels, their bytes, the rule
    python scripts/bench_bandwidth_beside_ring.py --out /tmp/bw        # on a GPU (docs/performance.md, command l)

An NCCL ring moves about 3 bytes of HBM per byte on its bus (collectives.RING_HBM_BYTES_PER_BUS_BYTE), through its
channels' CTAs (16 on an H100 NVLink ring). The estimator lets the memory-bound compute beside it lose that share c
of the bandwidth, a bandwidth-bound kernel taking 1 / (1 - c) of its time alone, and the GEMMs lose the SMs' share
instead. The bench stands in for the ring with a copy on another stream, of two kinds:
  ctas    a Triton copy kernel of k CTAs (--ctas, 16 by default; 16 warps each, an NCCL CTA's 512 threads) looping
          over a buffer: a ring's SMs and a share of the bandwidth, like NCCL's channels
  engine  a device-to-device copy (cudaMemcpyAsync, which torch's copy_ issues): the bandwidth without SMs, what the
          fake backend's all-gather is (docs/performance.md, command f)
Each copy is first timed alone for its own HBM rate (bytes read and written per second); c is that rate over the
device's sustained rate (a full-grid elementwise copy's, timed here). Then each target kernel is timed alone and
while the copy runs beside it, and the measured stretch is printed beside the rule's 1 / (1 - c) (memory-bound
targets) or SMs / (SMs - k) (the GEMM beside the CTA copy; 1 beside the engine).

Targets: one block's eager memory-bound ops at the estimator's 8B shapes for 1 x 4096 tokens (the SwiGLU product,
SiLU, a residual add, the fused RMSNorm, RoPE's upcast of q to fp32 and its downcast back) and w1's forward GEMM as
the control. The upcast's rate alone is also printed beside the estimator's (rates.eager_upcast_gbps: bytes per SM
and clock, at the part's boost clock; the downcast at the elementwise rate), a check of that rule on this part.
Output: a table on stdout and results.json under --out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_gemm_beside_sms import timed  # noqa: E402  (the same event timing, each call after a side launch)


def shapes(tokens: int) -> dict[str, int]:
    """The 8B block's widths as the estimator plans them: tokens, model dim, FFN width, q and k/v widths."""
    from torchtitan.config import parse_args
    from torchtitan.estimate.plan import build_plan

    args = ["--model.flavor=8B", f"--training.seq_len={tokens}", "--training.local_batch_size=1"]
    s = build_plan(parse_args([*args, "--estimate.hardware=h100-sxm"]), require_rates=False).shape
    return {"T": tokens, "D": int(s.d), "F": int(s.f), "Q": int(s.h), "KV": int(s.kv)}


def targets(sh: dict[str, int]) -> list[tuple[str, str, int]]:
    """(label, kind, bytes moved) of each target kernel: 'memory' targets are bandwidth-bound, 'gemm' the control."""
    t, d, f, q = sh["T"], sh["D"], sh["F"], sh["Q"]
    b = 2  # bf16
    return [
        ("swiglu product (mul)", "memory", 3 * t * f * b),
        ("silu", "memory", 2 * t * f * b),
        ("residual add", "memory", 3 * t * d * b),
        ("rms_norm (fused)", "memory", 2 * t * d * b + d * b),
        ("rope upcast (q to fp32)", "memory", t * q * (b + 4)),
        ("rope downcast (q to bf16)", "memory", t * q * (4 + b)),
        ("w1 forward (GEMM)", "gemm", (t * d + f * d + t * f) * b),
    ]


def rule(kind: str, side: str, c: float, sms: int, ctas: int) -> float:
    """The stretch the estimator's rule predicts for a target of `kind` beside a copy of `side` taking c of the
    bandwidth (and, for 'ctas', holding `ctas` SMs)."""
    if kind == "memory":
        return 1.0 / (1.0 - c)
    return sms / (sms - ctas) if side == "ctas" else 1.0


try:  # Triton resolves a kernel's names in its module's globals: the copy kernel is defined at module level
    import triton
    import triton.language as tl

    @triton.jit
    def _copy(src, dst, n, passes, BLOCK: tl.constexpr):
        # a grid-stride copy of n elements, `passes` times over, by however many CTAs the grid has
        start = tl.program_id(0) * BLOCK
        step = tl.num_programs(0) * BLOCK
        for _ in range(passes):
            for i in range(start, n, step):
                offs = i + tl.arange(0, BLOCK)
                m = offs < n
                tl.store(dst + offs, tl.load(src + offs, mask=m), mask=m)

except ImportError:  # CPU machines: --dry-run needs no Triton
    _copy = None


def calls(sh: dict[str, int]) -> list:
    """A call of each target of `targets(sh)`, in its order, on tensors of its shapes (bf16, CUDA)."""
    import torch
    import torch.nn.functional as F

    t, d, f, q = sh["T"], sh["D"], sh["F"], sh["Q"]
    bf, dev = torch.bfloat16, "cuda"
    a, g = torch.randn(t, f, dtype=bf, device=dev), torch.randn(t, f, dtype=bf, device=dev)
    x, y = torch.randn(t, d, dtype=bf, device=dev), torch.randn(t, d, dtype=bf, device=dev)
    w, xq = torch.ones(d, dtype=bf, device=dev), torch.randn(t, q, dtype=bf, device=dev)
    w1, xq32 = torch.randn(f, d, dtype=bf, device=dev), torch.randn(t, q, device=dev)
    fns = [lambda: a * g, lambda: F.silu(a), lambda: x + y, lambda: F.rms_norm(x, (d,), w), lambda: xq.float(),
           lambda: xq32.bfloat16(), lambda: x @ w1.t()]  # fmt: skip
    return fns


def run(sh: dict[str, int], ctas: int, loops: int, repeat: int) -> dict:
    import torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    n = 1 << 28  # 512 MiB of bf16 each way for the copies
    src, dst = (
        torch.randn(n, dtype=torch.bfloat16, device="cuda"),
        torch.empty(n, dtype=torch.bfloat16, device="cuda"),
    )
    # the device's sustained rate: a full-grid elementwise copy (read + write)
    device_rate = 2 * n * 2 / timed(lambda: torch.mul(src, 1, out=dst), repeat=repeat)
    side = torch.cuda.Stream()

    def copy(kind: str, passes: int):
        def go():
            with torch.cuda.stream(side):
                if kind == "ctas":
                    _copy[(ctas,)](src, dst, n, passes, BLOCK=4096, num_warps=16)
                else:
                    for _ in range(passes):
                        dst.copy_(src)

        return go

    sides = {}
    for kind in ("ctas", "engine"):
        with torch.cuda.stream(side):
            alone = timed(copy(kind, 1), repeat=3)
        sides[kind] = {"ms_per_pass": alone * 1e3, "rate_gbps": 2 * n * 2 / alone / 1e9,
                       "c": 2 * n * 2 / alone / device_rate}  # fmt: skip
    rows = []
    for (label, kind, nbytes), fn in zip(targets(sh), calls(sh)):

        def loop(fn=fn):
            for _ in range(loops):
                fn()

        alone = timed(loop, repeat=repeat) / loops
        row = {"target": label, "kind": kind, "bytes": nbytes, "alone_us": alone * 1e6,
               "alone_gbps": nbytes / alone / 1e9, "beside": {}}  # fmt: skip
        for k, s in sides.items():
            # enough passes of the copy to outlast the timed loop three times over
            passes = max(1, int(3 * alone * loops / (s["ms_per_pass"] / 1e3)) + 1)
            t = timed(loop, before=copy(k, passes), repeat=repeat) / loops
            row["beside"][k] = {"us": t * 1e6, "stretch": t / alone, "rule": rule(kind, k, s["c"], sms, ctas)}
        rows.append(row)
    return {"sms": sms, "device_gbps": device_rate / 1e9, "ctas": ctas, "copies": sides, "targets": rows}


def upcast_rule(device: str) -> dict:
    """The estimator's rates for this part's upcast and downcast (GB/s): rates.eager_upcast_gbps at its boost clock
    (or the H200's fraction of its bandwidth where no boost clock is listed) and the elementwise rate."""
    from torchtitan.estimate import rates
    from torchtitan.estimate.efficiency import DEFAULT
    from torchtitan.metrics.hardware import device_spec, match_device

    key = match_device(device)
    if key is None:
        return {}
    return {"part": key, "upcast_gbps": rates.eager_upcast_gbps(key),
            "downcast_gbps": DEFAULT.hbm * device_spec(key).hbm_gbps,
            "bytes_per_sm_cycle": rates.EAGER_UPCAST_BYTES_PER_SM_CYCLE,
            "boost_mhz": rates.BOOST_CLOCK_MHZ.get(rates.silicon(key))}  # fmt: skip


def print_run(res: dict) -> None:
    c, e = res["copies"]["ctas"], res["copies"]["engine"]
    print(f"device: {res['sms']} SMs, {res['device_gbps']:.0f} GB/s sustained (full-grid copy)")
    print(f"copy of {res['ctas']} CTAs: {c['rate_gbps']:.0f} GB/s, c = {c['c']:.3f}; engine copy: {e['rate_gbps']:.0f}"
          f" GB/s, c = {e['c']:.3f}")  # fmt: skip
    print(
        "| target | alone us | GB/s | beside CTA copy us | stretch | rule | beside engine copy us | stretch | rule |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in res["targets"]:
        b, g = r["beside"]["ctas"], r["beside"]["engine"]
        print(f"| {r['target']} | {r['alone_us']:.1f} | {r['alone_gbps']:.0f} | {b['us']:.1f} | {b['stretch']:.2f} |"
              f" {b['rule']:.2f} | {g['us']:.1f} | {g['stretch']:.2f} | {g['rule']:.2f} |")  # fmt: skip
    line = upcast_line(res)
    if line:
        print(line)


def upcast_line(res: dict) -> str | None:
    """The upcast's and downcast's rates alone against the estimator's (None on a part the table does not know)."""
    est = res.get("upcast_rule") or {}
    if not est:
        return None
    alone = {r["target"]: r["alone_gbps"] for r in res["targets"]}
    up, down = alone["rope upcast (q to fp32)"], alone["rope downcast (q to bf16)"]
    per_cycle = ""
    if est["boost_mhz"]:
        per_cycle = (
            f", {up * 1e3 / (res['sms'] * est['boost_mhz']):.2f} bytes per SM and clock at the boost clock"
        )
    return (
        f"upcast alone {up:.0f} GB/s{per_cycle}; the estimator's {est['part']}: {est['upcast_gbps']:.0f} GB/s"
        f" ({up / est['upcast_gbps']:.2f}x); downcast {down:.0f} GB/s, the elementwise rate {est['downcast_gbps']:.0f}"
        f" ({down / est['downcast_gbps']:.2f}x)"
    )


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per pass (the 8B's shapes at 1 x this)")
    ap.add_argument(
        "--ctas", type=int, default=16, help="CTAs of the Triton copy (NCCL's channels on an H100 ring)"
    )
    ap.add_argument("--loops", type=int, default=20, help="calls of a target per timing")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--out", default=None, help="folder for results.json")
    ap.add_argument("--dry-run", action="store_true", help="list the targets and their bytes; no GPU needed")
    a = ap.parse_args(argv)
    if a.tokens < 1 or a.ctas < 1 or a.loops < 1 or a.repeat < 1:
        ap.exit(2, f"{ap.prog}: error: --tokens, --ctas, --loops and --repeat must be >= 1\n")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    sh = shapes(a.tokens)
    if a.dry_run:
        print("8B at 1 x {T}: dim {D}, FFN {F}, q {Q}, k/v {KV}".format(**sh))
        for label, kind, nbytes in targets(sh):
            print(f"{label}: {kind}, {nbytes / 1e6:.1f} MB moved")
        print(
            "rule: memory-bound 1 / (1 - c); the GEMM SMs / (SMs - k) beside the CTA copy, 1 beside the engine"
        )
        return 0
    import torch

    if not torch.cuda.is_available() or _copy is None:
        print("bench_bandwidth_beside_ring: needs a CUDA GPU and Triton (use --dry-run to list the targets)",
              file=sys.stderr)  # fmt: skip
        return 2
    name = torch.cuda.get_device_name(0)
    res = {"device": name, "torch": torch.__version__, "shapes": sh, "upcast_rule": upcast_rule(name),
           **run(sh, a.ctas, a.loops, a.repeat)}  # fmt: skip
    print_run(res)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "results.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
