#!/usr/bin/env python
"""Memory-bound bytes one eager transformer block moves per token under this trainer's autocast (CPU, measured).

    python scripts/eager_elementwise_bytes.py                    # 1B and 8B block shapes, per-op SAC and no AC
    python scripts/eager_elementwise_bytes.py --flavor 1B --ac op --ops

One block of torchtitan/models/llama3 at the flavor's true widths (dim, heads, kv heads, FFN) is built, wrapped
by torchtitan/parallel/activation_checkpoint.py's apply_ac as the trainer wraps it, and run forward + backward as
one process of the trainer runs it: fp32 parameters, torch.autocast(bf16) around the forward
(torchtitan/parallel/mixed_precision.py), an fp32 block input (the residual stream: embedding output plus bf16
block outputs promotes to fp32) and an fp32 output gradient. A TorchDispatchMode records every aten op that
actually runs with the bytes of its tensor inputs and outputs; the per-op SAC's recompute (ops re-run inside the
checkpoint's recompute context) is told apart from the backward by wrapping that context. Each op is classed:
  matmul      mm, addmm, bmm, baddbmm, _scaled_mm (priced by the estimator's GEMM roofline, not here)
  attention   every scaled_dot_product / flash kernel and its backward (priced on its FLOPs)
  view        outputs sharing an input's storage (view, transpose, expand, detach, view_as_complex, ...): 0 bytes
  memory      everything else: reads of its tensor inputs + writes of its outputs (in-place ops: the mutated
              tensor counted as read and written)
Bytes are measured at two sequence lengths and split into a per-token slope (what scales with the tokens: the
activations) and a per-pass constant (what does not: the parameters' autocast casts, the weight gradients'
conversion to fp32), both per block.

CPU stands in for CUDA (this build has no CUDA; FakeTensorMode with device="cuda" tensors fails, and
autocast("cuda") disables itself without CUDA). The mappings, so that the stream is the one an H100 runs:
  * RMSNorm: CUDA torch >= 2.9 runs nn.RMSNorm as one fused kernel, aten._fused_rms_norm (output, rstd), and its
    backward as aten._fused_rms_norm_backward (grad_input, grad_weight) (pytorch/pytorch#153666); CPU runs the
    composite (pow, mean, add, rsqrt, mul, mul). The block's norms are replaced here by a custom op with the fused
    kernels' inputs and outputs (computed by the composite beneath the recording), so the norm is counted as the
    fused kernel's tensors: forward reads x and writes y (plus a per-row rstd), backward reads dy, x and rstd and
    writes dx (plus the weight gradient, per pass). Its dtype follows the input: under autocast the residual
    stream is fp32, so is the norm's output (rms_norm is on CUDA's autocast fp32 list; on CPU's list it is not,
    but an fp32 input and fp32 weight give an fp32 output either way).
  * Autocast op lists: the ops whose casts matter here are linear/matmul/mm and scaled_dot_product_attention,
    on both devices' lower-precision lists (torch._C._dispatch_dump shows AutocastCPU and AutocastCUDA kernels
    for aten::linear, aten::matmul, aten::mm, aten::scaled_dot_product_attention). aten::view_as_complex has an
    AutocastCPU kernel only; RoPE feeds it an fp32 tensor (x.float()), so no cast follows from it on either.
    Autocast caches the casts of leaf tensors that require grad (the parameters) only, on both devices.
  * Attention: flash attention is forced (torch.nn.attention.sdpa_kernel FLASH_ATTENTION): CPU's
    _scaled_dot_product_flash_attention_for_cpu stands for CUDA's flash / cuDNN kernel; both are classed
    attention, and both read q, k, v in the [B, S, H, D] memory layout the model's transposes give them and
    return an output whose transpose back is a view or a copy as the kernel lays it out (reported as measured).
Only the block is measured (no embedding, head or loss), as the estimator's per-block `elementwise_bytes`.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

from torchtitan.models.llama3 import Transformer, get_model_args  # noqa: E402
from torchtitan.parallel import activation_checkpoint  # noqa: E402
from torchtitan.parallel.activation_checkpoint import apply_ac  # noqa: E402

_aten = torch.ops.aten
MATMULS = {"mm", "addmm", "bmm", "baddbmm", "_scaled_mm"}

# ---- the fused RMSNorm's kernels, as custom ops (see the docstring's mapping)


@torch.library.custom_op("eagerbytes::fused_rms_norm", mutates_args=())
def fused_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * rstd * weight.float()).to(torch.promote_types(x.dtype, weight.dtype)), rstd


@fused_rms_norm.register_fake
def _(x, weight, eps):
    return x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype)), x.new_empty(
        (*x.shape[:-1], 1), dtype=torch.float32
    )


@torch.library.custom_op("eagerbytes::fused_rms_norm_backward", mutates_args=())
def fused_rms_norm_backward(
    dy: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    xf, dyf = x.float(), dy.float()
    xhat = xf * rstd
    dw = (dyf * xhat).flatten(0, -2).sum(0).to(weight.dtype)
    g = dyf * weight.float()
    dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
    return dx.to(x.dtype), dw


def _norm_setup(ctx, inputs, output):
    x, weight, _ = inputs
    ctx.save_for_backward(x, output[1], weight)


def _norm_backward(ctx, dy, _drstd):
    x, rstd, weight = ctx.saved_tensors
    dx, dw = fused_rms_norm_backward(dy, x, rstd, weight)
    return dx, dw, None


fused_rms_norm.register_autograd(_norm_backward, setup_context=_norm_setup)


def _use_fused_norm(norm: torch.nn.RMSNorm) -> None:
    eps = norm.eps if norm.eps is not None else torch.finfo(torch.float32).eps
    norm.forward = lambda x: fused_rms_norm(x, norm.weight, eps)[0]


# ---- recording


class Recorder(TorchDispatchMode):
    """Bytes of every op that runs, by (phase, class, op name)."""

    def __init__(self):
        super().__init__()
        self.phase = "forward"
        self.bytes: dict[tuple[str, str, str], float] = defaultdict(float)
        self.calls: dict[tuple[str, str, str], int] = defaultdict(int)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        name = func.overloadpacket.__name__
        mutable = func._schema.is_mutable
        in_storages = {t.untyped_storage().data_ptr() for t in ins}
        if name in MATMULS:
            kind = "matmul"
        elif "scaled_dot_product" in name or "flash" in name:
            kind = "attention"
        elif not mutable and outs and all(t.untyped_storage().data_ptr() in in_storages for t in outs):
            kind = "view"
        else:
            kind = "memory"
        nbytes = 0.0
        if kind != "view":
            # in-place / out= ops: the mutated tensor is an input (read) and an output (written)
            nbytes = sum(t.numel() * t.element_size() for t in ins + outs)
        key = (self.phase, kind, name)
        self.bytes[key] += nbytes
        self.calls[key] += 1
        return out


def _phase_contexts(rec: Recorder):
    """The trainer's per-op SAC contexts, the recompute one marking its ops as phase "recompute"."""
    original = activation_checkpoint._selective_contexts

    def contexts():
        fwd_ctx, rec_ctx = original()

        @contextlib.contextmanager
        def recompute():
            before, rec.phase = rec.phase, "recompute"
            try:
                with rec_ctx:
                    yield
            finally:
                rec.phase = before

        return fwd_ctx, recompute()

    return contexts


def measure(
    flavor: str,
    ac: str,
    seq: int,
    precision: str = "autocast",
    norm: str = "fused",
    batch: int = 1,
    **overrides,
) -> Recorder:
    """Record one block's forward + backward (+ per-op SAC recompute) over `batch` x `seq` tokens: under autocast
    (fp32 parameters and stream) or, for comparison, in plain bf16 (bf16 parameters and stream, no autocast: what
    FSDP's mixed precision gives a block). norm="composite" keeps the CPU's composite RMSNorm (what a CPU run
    moves) instead of the CUDA fused kernels' counts."""
    args = get_model_args(flavor, n_layers=1, max_seq_len=seq, **overrides)
    with torch.device("meta"):
        model = Transformer(args)
    model.tok_embeddings = model.norm = model.output = None
    model.to_empty(device="cpu")
    model.init_weights(0)
    block = model.layers["0"]
    if norm == "fused":
        _use_fused_norm(block.attention_norm)
        _use_fused_norm(block.ffn_norm)
    rec = Recorder()
    saved = activation_checkpoint._selective_contexts
    activation_checkpoint._selective_contexts = _phase_contexts(rec)
    try:
        mode, option = {"none": ("none", "op"), "op": ("selective", "op"), "full": ("full", "op")}[ac]
        apply_ac(model, mode, option)
    finally:
        activation_checkpoint._selective_contexts = saved
    block = model.layers["0"]
    dtype = torch.float32 if precision == "autocast" else torch.bfloat16
    block.to(dtype)
    torch.manual_seed(0)
    x = torch.randn(batch, seq, args.dim, dtype=dtype, requires_grad=True)  # the residual stream
    grad = torch.randn(batch, seq, args.dim, dtype=dtype)
    freqs = model.freqs_cis
    cast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "autocast")
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), rec:
        with cast:
            y = block(x, freqs)
        rec.phase = "backward"
        y.backward(grad)
    return rec


def per_token(
    flavor: str,
    ac: str,
    precision: str = "autocast",
    norm: str = "fused",
    s1: int = 32,
    s2: int = 64,
    **overrides,
):
    """{(phase, kind, op): (bytes per token, bytes per pass not scaling with tokens, calls)} of one block."""
    r1 = measure(flavor, ac, s1, precision, norm, **overrides)
    r2 = measure(flavor, ac, s2, precision, norm, **overrides)
    keys = set(r1.bytes) | set(r2.bytes)
    out = {}
    for k in keys:
        b1, b2 = r1.bytes.get(k, 0.0), r2.bytes.get(k, 0.0)
        slope = (b2 - b1) / (s2 - s1)
        out[k] = (slope, b1 - slope * s1, r2.calls.get(k, 0))
    return out


def summary(res: dict) -> dict[str, tuple[float, float]]:
    """phase -> (memory-bound bytes per token, memory-bound bytes per pass)."""
    tot: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for (phase, kind, _), (slope, const, _) in res.items():
        if kind == "memory":
            tot[phase][0] += slope
            tot[phase][1] += const
    return {p: (v[0], v[1]) for p, v in tot.items()}


def estimator_bytes(flavor: str, ac: str) -> dict[str, tuple[float, float, float]]:
    """phase -> (elementwise_bytes per token, autocast_eager_bytes per token, weight casts per pass) the estimator
    prices for this block in an eager one-GPU (autocast) run on an H100."""
    from torchtitan.config import parse_args
    from torchtitan.estimate import build_plan
    from torchtitan.estimate.steptime import (
        autocast_eager_bytes,
        autocast_weight_cast_bytes,
        elementwise_bytes,
    )

    argv = [
        f"--model.flavor={flavor}",
        "--training.mixed_precision_param=bfloat16",
        "--training.seq_len=8192",
    ]
    argv += ["--estimate.hardware=h100-sxm", "--estimate.num_devices=1"]
    if ac == "op":
        argv += ["--activation_checkpoint.mode=selective", "--activation_checkpoint.selective_ac_option=op"]
    plan = build_plan(parse_args(argv))
    (ew_f, ew_b), (a_f, a_b, a_r) = elementwise_bytes(plan), autocast_eager_bytes(plan)
    w = autocast_weight_cast_bytes(plan, plan.block_linears)
    out = {"forward": (ew_f, a_f, w), "backward": (ew_b, a_b, w)}
    if ac != "none":
        out["recompute"] = (ew_f, a_r, w)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--flavor", action="append", help="model flavor(s); default 1B and 8B")
    p.add_argument("--ac", action="append", choices=["none", "op", "full"], help="default none and op")
    p.add_argument("--ops", action="store_true", help="print the per-op breakdown")
    a = p.parse_args()
    torch.set_num_threads(1)
    for flavor in a.flavor or ["1B", "8B"]:
        for ac in a.ac or ["none", "op"]:
            res = per_token(flavor, ac)
            base = summary(per_token(flavor, ac, "bf16"))
            est = estimator_bytes(flavor, ac)
            print(
                f"## {flavor} block, AC {ac}: memory-bound bytes per token (per pass: not scaling with tokens)"
            )
            print(
                "phase      autocast B/tok  MB/pass | plain bf16 B/tok | estimator B/tok (before + autocast term)"
            )
            for phase, (tok, const) in sorted(summary(res).items()):
                e0, e1, w = est[phase]
                print(
                    f"{phase:10s} {tok:14.0f} {const / 1e6:8.1f} | {base[phase][0]:16.0f} | "
                    f"{e0 + e1:10.0f} ({e0:.0f} + {e1:.0f}; weights {w / 1e6:.1f} MB/pass)"
                )
            if a.ops:
                rows = sorted(res.items(), key=lambda kv: (kv[0][0], -abs(kv[1][0])))
                for (phase, kind, op), (slope, const, calls) in rows:
                    if kind == "view" or (abs(slope) < 0.5 and abs(const) < 1e3):
                        continue
                    print(
                        f"  {phase:10s} {kind:9s} {op:45s} x{calls:<3d} {slope:10.0f} B/tok {const / 1e6:9.1f} MB"
                    )
            print()


if __name__ == "__main__":
    main()
