"""Step time of a training configuration, per rank, by component (docs/estimate.md, "Time model").

compute      forward + backward of every matmul (roofline per GEMM shape: FLOPs at the dtype's sustained peak,
             or its bytes at the sustained HBM bandwidth, whichever is slower), flash attention on the FLOPs it
             does (causal: half the score matrix), memory-bound elementwise work by its bytes (norms, RoPE,
             SwiGLU, residual adds; fused by compile), the loss, and float8's amax/cast/transpose passes
recompute    the forward work activation checkpointing repeats in backward
exposed communication, by dimension:
   fsdp      all-gathers are prefetched one unit ahead and reduce-scatters drain behind the next unit's backward;
             what a unit's compute cannot hide is exposed, plus the first all-gather and the last reduce-scatter,
             plus what the collectives' SMs cost the compute beside them (on Hopper, a persistent GEMM launched
             beside a collective ends up to one GEMM late: collectives.overlap_extension)
   tp        sequence-parallel all-gathers / reduce-scatters of every block: on the critical path (without loss
             parallel, also the logits' all-gather)
   cp        all-gathered (rotate_method allgather) K/V before attention: exposed; alltoall: overlapped ring
   pp        point-to-point activation/gradient transfers, per micro-batch and stage
pipeline_bubble  idle time of the schedule: (p-1)/m of the work for 1F1B/GPipe, (p-1)/(v*m) interleaved, a third
             of that for the zero-bubble schedules
optimizer    AdamW + the gradient norm (and clipping) over this rank's fp32 shard, or plain SGD: memory-bound
straggler    the wait for the slowest of the job's GPUs: a share of the synchronised compute (stragglers.py)
measured_beyond_model   CPU with a calibration whose probe ran this plan: the trainer's own step measured at two
             depths and carried linearly to the plan's (measured_step), less the terms above
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field

from . import collectives, rates, stragglers
from .activations import (
    block_modes,
    recomputed_matmuls,
    recomputes_attention,
    recomputes_elementwise,
    tp_collectives_recomputed,
)
from .memory import (
    MASTER_BYTES,
    accumulated_grad_params,
    fp8_param_share,
    gather_bytes,
    holds_unsharded_grads,
)
from .plan import Linear, Plan

ADAMW_BYTES_PER_PARAM = {"foreach": 84, "for-loop": 84, "fused": 28}  # passes over param, grad, 2 moments
CLIP_NORM_BYTES, CLIP_SCALE_BYTES = 4, 8  # the norm reads each fp32 gradient; clipping reads and writes it
SGD_ELEMENTS_PER_PARAM = 3  # plain SGD: read the parameter and its gradient, write the parameter
CP_MERGE_FWD_BYTES = 24  # per query element and ring step: fp32 merge of the partial attention output
CP_MERGE_BWD_BYTES = 8  # per q/k/v element and ring step: fp32 gradient accumulation


@dataclass
class Pass:
    """Seconds of one forward+backward pass over some blocks, by kind of work."""

    matmul: float = 0.0
    attention: float = 0.0
    elementwise: float = 0.0
    loss: float = 0.0
    float8_casts: float = 0.0
    recompute: float = 0.0
    fwd: float = 0.0  # forward share (for FSDP overlap)
    gemms: int = 0  # GEMM launches of the forward + backward (for FSDP overlap on static persistent GEMMs)
    detail: dict = field(default_factory=dict)

    @property
    def compute(self) -> float:
        return self.matmul + self.attention + self.elementwise + self.loss + self.float8_casts

    @property
    def total(self) -> float:
        return self.compute + self.recompute


class Rates:
    """Sustained rates on this hardware: published microbenchmarks by shape (rates.py), or calibrated measurements."""

    def __init__(self, plan: Plan):
        hw, eff, cal = plan.hw, plan.eff, plan.calibration
        self.cal = cal
        self.hw = hw
        self.recipe = plan.cfg.float8.recipe if plan.cfg.float8.enable else None
        self.cpu_peak = None
        # the power limit's factor on compute, or a locked SM clock's where it binds first (rates.compute_factor)
        self.compute_factor = (
            1.0 if hw.is_cpu else rates.compute_factor(hw.name, hw.power_limit_w, hw.sm_clock_mhz)
        )
        self.hbm = hw.hbm_gbps * 1e9 * eff.hbm
        self.intra = hw.intra_node_gbps * 1e9 * collectives.intra_fraction(hw.name, eff.intra_node)
        self.inter = hw.inter_node_gbps * 1e9 * eff.inter_node
        if hw.inter_node_busbw_gbps:  # measured for full nodes: each GPU's share of it (collectives.busbw)
            self.inter = hw.inter_node_busbw_gbps * 1e9 / hw.devices_per_node
        self.attn_measured = None
        self.loss_per_logit = None  # seconds per logit of the eager loss, where calibrated
        self.head_dim = plan.args.head_dim
        self.attn_backend = plan.cfg.estimate.attention_backend
        if cal is not None:
            if cal.attention_tflops:
                self.attn_measured = cal.attention_tflops * 1e12
            if cal.hbm_gbps:
                self.hbm = cal.hbm_gbps * 1e9
            if cal.collective_gbps:
                self.intra = cal.collective_gbps * 1e9
                if hw.is_cpu:
                    self.inter = self.intra
            if cal.loss_ns_per_logit:
                self.loss_per_logit = cal.loss_ns_per_logit * 1e-9
            if cal.matmul_peak_tflops and hw.is_cpu:
                self.cpu_peak = cal.matmul_peak_tflops * 1e12

    def flops_rate(self, m: float, n: float, k: float, fp8: bool) -> float:
        """FLOP/s a GEMM of this shape sustains in bf16 or float8 (tensorwise) on this device."""
        if self.cpu_peak is not None:
            return self.cpu_peak
        hw = self.hw
        if fp8 and hw.fp8_tflops:
            return hw.fp8_tflops * 1e12 * rates.gemm_efficiency(hw.name, "fp8", m, n, k) * self.compute_factor
        return hw.bf16_tflops * 1e12 * rates.gemm_efficiency(hw.name, "bf16", m, n, k) * self.compute_factor

    def gemm(self, m: float, n: float, k: float, fp8: bool, act_bytes: int, backward: bool = False) -> float:
        """Seconds of one [m,k] x [k,n] GEMM: measured if calibrated for this shape, else the roofline."""
        if self.cal is not None and not fp8:
            measured = self.cal.matmul_tflops.get((int(m), int(n), int(k)))
            if measured:
                return 2 * m * n * k / (measured * 1e12)
        flops = 2 * m * n * k
        in_b = 1 if fp8 else act_bytes
        moved = (m * k + k * n) * in_b + m * n * act_bytes
        rate = self.flops_rate(m, n, k, fp8)
        extra = 0.0
        if fp8 and self.recipe == "rowwise":
            if backward:  # cuBLAS with unit scales, then a separate rescale pass over the output
                extra = m * n * rates.ROWWISE_RESCALE_BYTES / self.hbm
            else:  # torch's CUTLASS rowwise kernel
                rate *= rates.ROWWISE_FWD_RATE
        return max(flops / rate, moved / self.hbm) + extra

    def attention(self, seq: float, backward: bool, causal: bool = True) -> float:
        """FLOP/s of flash attention at this per-rank sequence length (causal, or without a mask)."""
        if self.attn_measured is not None:
            return self.attn_measured
        if self.cpu_peak is not None:
            return self.cpu_peak
        frac = rates.attention_fraction(self.hw.name, seq, backward, causal, self.head_dim, self.attn_backend)
        # the measured curves are benchmark loops; a run holds the power limit for minutes
        frac *= rates.attention_sustained_factor(self.hw.name)
        return self.hw.bf16_tflops * 1e12 * frac * self.compute_factor


def _local(lin: Linear, tp: int) -> tuple[int, int]:
    """(in, out) features of a linear on one tensor-parallel rank."""
    if tp == 1:
        return lin.in_features, lin.out_features
    if lin.colwise:
        return lin.in_features, lin.out_features // tp
    return lin.in_features // tp, lin.out_features


def _linear_time(r: Rates, lin: Linear, tokens: float, tp: int, b: int) -> tuple[float, float]:
    """(forward, backward) seconds of one linear over `tokens` rows: y = x W^T, dx = dy W, dW = dy^T x."""
    k, n = _local(lin, tp)
    fwd = r.gemm(tokens, n, k, lin.float8, b)
    bwd = r.gemm(tokens, k, n, lin.float8, b, backward=True) + r.gemm(
        n, k, tokens, lin.float8, b, backward=True
    )
    return fwd, bwd


# eager SiLU and gate product, bytes per FFN element in units of the activation bytes: forward SiLU (read, write) and
# the product (two reads, a write); backward their gradients (9)
EAGER_SWIGLU_BYTES = (5, 9)


def elementwise_bytes(plan: Plan) -> tuple[float, float]:
    """(forward, backward) bytes of a block's memory-bound elementwise work per token (docs/estimate.md).

    Eager: RMSNorm fused (torch >= 2.9 on CUDA: one kernel, pytorch/pytorch#153666) or composite (older torch,
    and CPU), RoPE as the model's eager path writes it (upcast to fp32, one complex multiply, downcast: b + 4,
    4 + 4 and 4 + b bytes per element of q and k, the same backward), the copy of the attention output into wo's
    layout, SiLU and the gate product, two residual adds. Compiled: norms fused with the residual adds, RoPE in
    one kernel, SiLU x gate in one kernel.
    """
    s, b = plan.shape, plan.act_bytes
    qk = s.h + s.kv
    if plan.compile_model:
        fwd = 8 * b * s.d_s + 2 * b * qk + 2 * b * s.h + 3 * b * s.f
        bwd = 10 * b * s.d_s + 2 * b * qk + 2 * b * s.h + 5 * b * s.f
    else:
        rope = 16 + 2 * b
        # fused RMSNorm reads and writes each element once (backward: reads grad and input, writes grad); the
        # composite one (CPU, torch < 2.9) upcasts (b+4), squares (8), averages (4), scales (8), downcasts (4+b)
        # and applies the weight (2b): 28 + 4b, and about twice that backward
        norm_f = 2 * b if s.fused_norm else 28 + 4 * b
        norm_b = 3 * b if s.fused_norm else 2 * (28 + 4 * b)
        swiglu_f, swiglu_b = (n * b * s.f for n in EAGER_SWIGLU_BYTES)
        fwd = (2 * norm_f + 6 * b) * s.d_s + rope * qk + 2 * b * s.h + swiglu_f
        bwd = (2 * norm_b + 6 * b) * s.d_s + rope * qk + 2 * b * s.h + swiglu_b
    return fwd, bwd


def _beyond_elementwise(plan: Plan, r: Rates, nbytes: float, fraction: float) -> float:
    """Seconds `nbytes` take at `fraction` of the part's bandwidth beyond their time at the elementwise rate (r.hbm)."""
    return max(0.0, nbytes / (fraction * plan.hw.hbm_gbps * 1e9) - nbytes / r.hbm)


def eager_norm_extra(plan: Plan, r: Rates) -> tuple[float, float]:
    """(forward, backward) seconds per token a block's two fused eager RMSNorms take beyond their bytes at the
    elementwise rate (r.hbm): torch's kernels as measured on the part's sibling (rates.eager_rms_norm_fraction),
    on the bytes elementwise_bytes counts for them. Zero for compiled blocks (Inductor fuses the norms with the
    residual adds), the composite norm of older torch and CPUs, and parts without a measurement."""
    s, b = plan.shape, plan.act_bytes
    if plan.compile_model or not s.fused_norm or plan.hw.is_cpu:
        return 0.0, 0.0
    out = []
    for backward, per_element in ((False, 2 * b), (True, 3 * b)):
        frac = rates.eager_rms_norm_fraction(plan.hw.name, s.d, backward)
        if frac is None:
            return 0.0, 0.0
        out.append(_beyond_elementwise(plan, r, 2 * per_element * s.d_s, frac))
    return out[0], out[1]


def eager_swiglu_extra(plan: Plan, r: Rates) -> tuple[float, float]:
    """(forward, backward) seconds per token a block's eager SiLU and gate product take beyond their bytes at the
    elementwise rate (r.hbm) when they read the two strided halves of one fused gate/up linear
    (`--estimate.swiglu=split`): the bytes elementwise_bytes counts for them (EAGER_SWIGLU_BYTES) at
    rates.STRIDED_SWIGLU_FRACTION of the part's bandwidth. Zero for compiled blocks and for separate linears."""
    if plan.compile_model or plan.cfg.estimate.swiglu != "split" or plan.hw.is_cpu:
        return 0.0, 0.0
    per_token = (n * plan.act_bytes * plan.shape.f for n in EAGER_SWIGLU_BYTES)
    fwd, bwd = (_beyond_elementwise(plan, r, nbytes, rates.STRIDED_SWIGLU_FRACTION) for nbytes in per_token)
    return fwd, bwd


def upcast_extra(plan: Plan, r: Rates, elements: float) -> float:
    """Seconds `elements` bf16 -> fp32 upcasts take beyond their bytes ((b + 4) each) at the elementwise rate (r.hbm):
    torch runs a dtype-converting copy from bf16 to fp32 as an unrolled, non-vectorized kernel, bound by its
    instructions (rates.eager_upcast_gbps: bytes per SM and clock; the downcast back is vectorized: the
    elementwise rate). Zero where nothing is upcast (fp32 activations) and on CPUs."""
    if plan.hw.is_cpu or plan.act_bytes != 2:
        return 0.0
    gbps = rates.eager_upcast_gbps(plan.hw.name, plan.hw.sm_clock_mhz, plan.hw.hbm_gbps)
    return _beyond_elementwise(plan, r, (plan.act_bytes + 4) * elements, gbps / plan.hw.hbm_gbps)


def eager_upcast_extra(plan: Plan, r: Rates) -> tuple[float, float]:
    """(forward, backward) seconds per token a block's eager upcasts take beyond their bytes at the elementwise rate
    (upcast_extra): RoPE's upcasts of q and k (forward the activations, `.float()`; backward their gradients, the
    gradient of `.type_as()`); for the composite RMSNorm (`--estimate.eager_rms_norm=composite`) on a bf16 residual
    stream, each norm's upcast of its input forward and of its output gradient backward (the gradient of its
    downcast; on autocast's fp32 stream both casts are no-ops); under autocast, backward, the gradient of each
    stream-input linear's cast of its fp32 input (autocast_eager_bytes' n_cast casts). Zero for compiled blocks
    (Inductor fuses the casts)."""
    if plan.compile_model:
        return 0.0, 0.0
    s = plan.shape
    fwd = s.h + s.kv + (0 if s.fused_norm or plan.stream_bytes != plan.act_bytes else 2 * s.d_s)
    bwd = fwd
    if plan.autocast:
        bwd += stream_input_casts(plan) * s.d
    return upcast_extra(plan, r, fwd), upcast_extra(plan, r, bwd)


def autocast_weight_grad_upcast(plan: Plan, r: Rates, linears) -> float:
    """Seconds per pass that autocast's conversions of `linears`' bf16 weight gradients to their fp32 parameters'
    dtype (the backward of autocast_weight_cast_bytes' casts) take beyond their bytes at the elementwise rate, in an
    eager pass: the unrolled upcast (upcast_extra). Zero without autocast (autocast_cast_params)."""
    return upcast_extra(plan, r, autocast_cast_params(plan, linears))


# the linears whose input is a normed residual-stream tensor (the others read attention's / SwiGLU's bf16 output):
# the attention's three, then the feed-forward's two
ATTENTION_INPUT_LINEARS = ("wq", "wk", "wv")
STREAM_INPUT_LINEARS = (*ATTENTION_INPUT_LINEARS, "w1", "w3")


def stream_input_casts(plan: Plan) -> int:
    """How many of a block's linears cast a normed residual-stream tensor under autocast (one cast each)."""
    return sum(1 for lin in plan.block_linears if lin.name in STREAM_INPUT_LINEARS)


def autocast_eager_bytes(plan: Plan) -> tuple[float, float, float]:
    """(forward, backward, recompute) bytes per token that an eager block moves under autocast beyond
    `elementwise_bytes` (docs/estimate_log.md, "Eager under autocast: the casts and fp32 traffic measured"; measured
    by scripts/eager_elementwise_bytes.py, which the unit test pins these bytes to).

    With one data-parallel rank the trainer keeps fp32 parameters and autocasts the forward
    (parallel/mixed_precision.py): the residual stream is fp32 (`Plan.stream_bytes`, sb), so both norms read and
    write sb-byte elements and the two residual adds read sb + b and write sb; each linear that reads a normed
    (fp32) tensor casts it to bf16 itself (autocast caches only the casts of leaf tensors that require grad: the
    weights), five casts of sb + b bytes per element (the composite RMSNorm of CPUs instead loses its own up- and
    downcasts, its input and output being fp32 already). Backward: the norms (dy, x, dx) and the residual-gradient adds
    in fp32; each cast's backward converts the bf16 input gradient back to fp32 and autograd sums the three (wq,
    wk, wv) and two (w1, w3) copies in fp32; the gradients of the two bf16 branch outputs are cast from the fp32
    stream's. The recompute is the forward without its last residual add (non-reentrant checkpointing stops once
    the saved tensors backward needs are rebuilt)."""
    if not plan.autocast or plan.compile_model:
        return 0.0, 0.0, 0.0
    s, b, sb = plan.shape, plan.act_bytes, plan.stream_bytes
    wide = sb - b  # the stream's extra bytes per element over the activation dtype
    n_cast = stream_input_casts(plan)
    add = 2 * wide * s.d_s  # one residual add's extra: the stream read and written wider
    # fused: one kernel reads x and writes y (backward: reads dy and x, writes dx), all sb-byte elements;
    # composite: its upcast of the input and downcast of the output (b + 4 bytes each) are no-ops on fp32
    norm_f, norm_b = (2 * wide, 3 * wide) if s.fused_norm else (-2 * (b + 4), -2 * (b + 4))
    fwd = 2 * norm_f * s.d_s + 2 * add + n_cast * (sb + b) * s.d
    bwd = 2 * norm_b * s.d_s + 2 * (3 * wide) * s.d_s + n_cast * (b + sb) * s.d
    bwd += (n_cast - 2) * 3 * wide * s.d + 2 * (sb + b) * s.d_s
    return fwd, bwd, fwd - add


def autocast_weight_cast_bytes(plan: Plan, linears) -> float:
    """Bytes per pass of autocast's weight casts for `linears` (no FSDP wrapper): each fp32 weight read and written
    in bf16 once per forward (and again in a checkpointed block's recompute: the cast is outside the per-op save
    list), and its bf16 gradient converted to the fp32 parameter's in backward, 4 + b bytes per parameter each time.
    Measured eager (scripts/eager_elementwise_bytes.py) and compiled: the graphs Inductor's partitioner gives a block
    hold the same conversions, the recast in backward under per-op SAC and full AC, none without AC, which keeps the
    bf16 copies (scripts/compiled_weight_casts.py); no kernel fuses a cast into the matmul it feeds. A float8 linear
    casts its fp32 weight to float8 itself (priced with the float8 casts)."""
    return autocast_cast_params(plan, linears) * (4 + plan.act_bytes)


def autocast_cast_params(plan: Plan, linears) -> float:
    """Parameters of `linears` on this rank whose fp32 weights autocast casts (none without autocast; a float8
    linear casts its own)."""
    if not plan.autocast:
        return 0.0
    return sum(lin.in_features * lin.out_features / plan.tp_shards(lin) for lin in linears if not lin.float8)


FLOAT8_TP_GROUPS = {
    "wq": "attn",
    "wk": "attn",
    "wv": "attn",
    "w1": "ffn",
    "w3": "ffn",
    "wo": "wo",
    "w2": "w2",
}


def float8_tp_precast(plan: Plan) -> dict[str, bool]:
    """Which tensors torchao's float8 TP styles cast to float8 once, before their collective, instead of in each
    consuming Float8Linear: "attn" / "ffn", the input of wq, wk, wv / w1, w3 (PrepareFloat8ModuleInput), and "wo" /
    "w2", the gradient of that linear's output (Float8RowwiseParallel's NoopFwToFloat8BwDynamic). The trainer's TP
    plan uses them exactly where those collectives carry 1 byte (`sp_all_gather_bytes`), on GPUs under TP."""
    if plan.tp == 1:
        return dict.fromkeys(("attn", "ffn", "wo", "w2"), False)
    attn_in, ffn_in, wo_grad, w2_grad = sp_all_gather_bytes(plan)
    return {"attn": attn_in == 1, "ffn": ffn_in == 1, "wo": wo_grad == 1, "w2": w2_grad == 1}


def _float8_cast_bytes(plan: Plan, lin: Linear) -> tuple[float, float, float]:
    """(forward per token, backward per token, per pass per weight) bytes of torchao's dynamic float8 scaling for a
    converted linear: amax + cast of the input (fwd) and of the output gradient (bwd), the input re-cast and both
    transposed for the weight gradient, the weight cast and transpose once per pass (fused by compile).

    Under torchao's float8 TP styles (`float8_tp_precast`) a Float8Linear whose input, or output gradient, arrives
    already in float8 skips that cast (torchao float8/float8_linear.py, `matmul_with_hp_or_float8_args`:
    `tensor_already_casted_to_fp8`) and uses the tensor for the weight gradient too, which torch._scaled_mm then
    needs transposed (one read and one write per element); the one shared cast is `float8_tp_shared_cast_bytes`."""
    k, n = _local(lin, plan.tp)
    c_in, c_grad = (3, 5) if plan.compile_model else (5, 7)
    weight = 2.0 if plan.float8_all_gather else 7.0
    pre = float8_tp_precast(plan)
    group = FLOAT8_TP_GROUPS.get(lin.name, "")
    if lin.colwise and pre.get(group, False):
        return 0.0, 2 * k + c_grad * n, weight
    if not lin.colwise and pre.get(group, False):
        return c_in * k, c_in * k + 2 * n, weight
    return c_in * k, c_in * k + c_grad * n, weight


def float8_tp_shared_cast_bytes(plan: Plan, recomputed: set[str]) -> tuple[float, float, float]:
    """(forward, backward, recompute) bytes per token of the float8 casts torchao's TP styles do once per group,
    before the collective: on the sequence-sharded tensor under sequence parallel (1/tp of the tokens), an input
    cast (amax + cast) per pre-cast input, a gradient cast per pre-cast output gradient; the recompute repeats an
    input's cast when it repeats one of its consumers."""
    pre = float8_tp_precast(plan)
    share = plan.args.dim / plan.tp if plan.sequence_parallel else plan.args.dim
    c_in = 3 if plan.compile_model else 5
    fwd = c_in * share * (pre["attn"] + pre["ffn"])
    bwd = c_in * share * (pre["wo"] + pre["w2"])
    rec = (
        c_in
        * share
        * sum(pre[g] and any(FLOAT8_TP_GROUPS[name] == g for name in recomputed) for g in ("attn", "ffn"))
    )
    return fwd, bwd, rec


def rowwise_measured(plan: Plan, r: Rates) -> bool:
    """Float8 rowwise linears priced by torchao's measured speedup table (rates.ROWWISE_SPEEDUP): Hopper parts, blocks
    compiled (as the table was measured), no calibration of this machine's own GEMMs."""
    return (
        r.recipe == "rowwise"
        and plan.compile_model
        and r.cal is None
        and rates.silicon(plan.hw.name) in rates.ROWWISE_TABLE_DEVICES
    )


def _rowwise_measured_time(
    r: Rates, lin: Linear, tokens: float, tp: int, b: int, f: float, bw: float
) -> tuple[float, float, float, float]:
    """(forward GEMMs, backward GEMMs, forward casts, backward casts) seconds of a float8 rowwise linear whose total is
    the bf16 linear's time over torchao's measured speedup at its per-rank forward shape (M = tokens, K, N); the
    modelled float8 GEMM times stay the GEMM share and the rest of the measured time is attributed to the casts
    (none when the measurement is faster than the modelled GEMMs)."""
    k, n = _local(lin, tp)
    bf16_f, bf16_bw = _linear_time(r, dataclasses.replace(lin, float8=False), tokens, tp, b)
    speedup = rates.rowwise_linear_speedup(tokens, k, n)
    tot_f, tot_b = bf16_f / speedup, bf16_bw / speedup
    return min(f, tot_f), min(bw, tot_b), max(0.0, tot_f - f), max(0.0, tot_b - bw)


def block_pass(plan: Plan, r: Rates, mode: str, tokens: float) -> Pass:
    """One block's forward + backward (+ recompute) over `tokens` tokens."""
    p, s, b = Pass(), plan.shape, plan.act_bytes
    rec_mm = recomputed_matmuls(mode, s.recompute_stops_early)
    p.gemms = 3 * len(plan.block_linears)  # forward, input gradient, weight gradient
    for lin in plan.block_linears:
        f, bw = _linear_time(r, lin, tokens, plan.tp, b)
        t_f = t_b = 0.0
        if lin.float8 and rowwise_measured(plan, r):
            f, bw, t_f, t_b = _rowwise_measured_time(r, lin, tokens, plan.tp, b, f, bw)
        elif lin.float8:
            fb, bb, wb = _float8_cast_bytes(plan, lin)
            k, n = _local(lin, plan.tp)
            t_f = (fb * tokens + wb * k * n / 2) / r.hbm
            t_b = (bb * tokens + wb * k * n / 2) / r.hbm
        p.matmul += f + bw
        p.float8_casts += t_f + t_b
        p.fwd += f + t_f
        if lin.name in rec_mm:
            p.recompute += f + t_f
    if plan.float8:
        c_f, c_b, c_r = float8_tp_shared_cast_bytes(plan, set(rec_mm))
        p.float8_casts += (c_f + c_b) * tokens / r.hbm
        p.fwd += c_f * tokens / r.hbm
        p.recompute += c_r * tokens / r.hbm
    # flash attention: queries of this rank x (seq_len / 2) keys on average (causal, load-balanced under CP)
    attn_fwd_flops = 4 * tokens * (plan.seq_len / 2) * s.h
    seq = plan.seq_len / plan.cp  # the rank's queries (two load-balanced chunks under CP)
    attn_bwd_flops = 2.5 * attn_fwd_flops  # 5 matmuls backward (scores recomputed) vs 2 forward
    t_af = t_ab = 0.0
    for share, length, causal in ring_attention_kernels(plan.cp, seq):
        t_af += share * attn_fwd_flops / r.attention(length, backward=False, causal=causal)
        t_ab += share * attn_bwd_flops / r.attention(length, backward=True, causal=causal)
    p.attention = t_af + t_ab
    p.fwd += t_af
    if recomputes_attention(mode, s.op_saves_attention):
        p.recompute += t_af
    # the block's own elementwise work (norms, RoPE, SiLU, residual adds; autocast's casts): by its bytes, or as the
    # calibration measured it in place, in the bytes' proportions of forward, backward and recompute
    ew_f, ew_b = elementwise_bytes(plan)
    a_f, a_b, a_r = autocast_eager_bytes(plan)
    w = autocast_weight_cast_bytes(plan, plan.block_linears)
    t_ef, t_eb = ((ew_f + a_f) * tokens + w) / r.hbm, ((ew_b + a_b) * tokens + w) / r.hbm
    t_er = ((ew_f + a_r) * tokens + w) / r.hbm if recomputes_elementwise(mode) else 0.0
    for extra_f, extra_b in (
        eager_norm_extra(plan, r),
        eager_swiglu_extra(plan, r),
        eager_upcast_extra(plan, r),
    ):
        t_ef, t_eb = t_ef + extra_f * tokens, t_eb + extra_b * tokens
        t_er += extra_f * tokens if recomputes_elementwise(mode) else 0.0
    if not plan.compile_model:
        t_eb += autocast_weight_grad_upcast(plan, r, plan.block_linears)
    in_place = block_in_place(plan)
    if in_place is not None:
        scale = in_place * tokens / (t_ef + t_eb)
        t_ef, t_eb, t_er = t_ef * scale, t_eb * scale, t_er * scale
    if plan.cp > 1:
        # ring attention: every step's partial output is merged into an fp32 running output and logsumexp
        # (~24 bytes per query element); backward accumulates dq, dk, dv in fp32 per step (8 bytes each)
        m_f = plan.cp * CP_MERGE_FWD_BYTES * s.h * tokens / r.hbm
        t_ef += m_f
        t_eb += plan.cp * CP_MERGE_BWD_BYTES * (s.h + 2 * s.kv) * tokens / r.hbm
        t_er += m_f if recomputes_elementwise(mode) else 0.0
    p.elementwise = t_ef + t_eb
    p.fwd += t_ef
    p.recompute += t_er
    c_f, c_b, c_r = sp_layout_copy_bytes(plan, mode)
    t_cf, t_cb, t_cr = (c * tokens / r.hbm for c in (c_f, c_b, c_r))
    p.elementwise += t_cf + t_cb
    p.fwd += t_cf
    p.recompute += t_cr
    return p


def block_in_place(plan: Plan) -> float | None:
    """Seconds per token of one block's work beside its GEMMs and attention, measured in place: the calibration's
    eager block (calibrate.measure_block: the trainer's block on this rank's shapes, forward + backward) less the
    same GEMMs and attention called alone, timed in turn with it -- the norms, RoPE, SiLU, casts and copies as they
    run, the host's own time (autograd, Python) and the kernels' slowdown in place; under tensor parallelism on a
    CPU plus the host time DTensor adds to the block (calibrate.measure_tp_dispatch). None without that
    measurement or where it does not apply (compiled or float8 runs)."""
    cal = plan.calibration
    if cal is None or not cal.block_s or not cal.block_tokens or not plan.block_measurable:
        return None
    dtensor = (cal.tp_dispatch_s or 0.0) if plan.tp > 1 else 0.0  # DTensor's host time (tensor parallel, CPU)
    return max(0.0, cal.block_s - (cal.block_kernels_s or 0.0) + dtensor) / cal.block_tokens


def head_in_place(plan: Plan) -> float | None:
    """Seconds per token of the head's work beside its GEMMs, measured in place: the calibration's final norm,
    output projection and loss (calibrate.measure_head) less the projection's GEMMs called alone, timed in turn
    with it. None without that measurement or where it does not apply (compiled, float8 or tensor-parallel runs)."""
    cal = plan.calibration
    if cal is None or not cal.head_s or not cal.block_tokens or not plan.head_measurable:
        return None
    return max(0.0, cal.head_s - (cal.head_kernels_s or 0.0)) / cal.block_tokens


def sp_layout_copy_bytes(plan: Plan, mode: str) -> tuple[float, float, float]:
    """(forward, backward, recompute) bytes per token of the layout copies around a block's sequence-parallel
    collectives (measured in Inductor's code for a compiled sequence-parallel block by scripts/sp_layout_copies.py;
    docs/estimate.md, "sequence-parallel layout copies").

    The residual stream is [batch, seq / tp, d] and sequence parallelism shards dim 1, while NCCL gathers and
    scatters along dim 0: torch's functional collectives (torch/distributed/_functional_collectives.py) re-lay the
    all-gather's [tp x batch, seq / tp, d] output into [batch, seq, d] (`_maybe_view_chunk_cat`: a view only when
    the local batch is 1) and the reduce-scatter's [batch, seq, d] input into tp chunks along dim 0
    (`_chunk_or_narrow_cat`: always a copy). Inductor keeps both as copy kernels (`cat_split`). Each reads and
    writes the gathered tensor, tokens x d elements at the collective's element size. torch's async TP replaces
    the collectives it fuses with all-gather-matmul / matmul-reduce-scatter ops that take shards in place (the
    micro-pipeline pass restrides their operands: torch/distributed/_symmetric_memory, "no extra copy is
    required"), so there only the backward's unfused reduce-scatters copy."""
    if plan.tp == 1 or not plan.sequence_parallel:
        return 0.0, 0.0, 0.0
    d, b = plan.args.dim, plan.act_bytes
    if plan.async_tp:
        # only the backward's two reduce-scatters, which async TP leaves unfused (`async_tp_unfused`), copy
        return 0.0, 2 * d * 2 * b, 0.0
    attn_in, ffn_in, wo_grad, w2_grad = sp_all_gather_bytes(plan)
    attn_gathers, ffn_gathers, input_grads = tp_input_collectives(plan)
    gather_copies = plan.microbatch_seqs > 1  # all-gather output re-laid only when the local batch is > 1
    ag_f = (attn_gathers * attn_in + ffn_gathers * ffn_in) if gather_copies else 0
    ag_b = (wo_grad + w2_grad) if gather_copies else 0
    fwd = 2 * d * (ag_f + 2 * b)  # the all-gathers + 2 reduce-scatters, each read + written
    bwd = 2 * d * (ag_b + input_grads * b)
    n = tp_collectives_recomputed(mode, plan.shape.recompute_stops_early)
    rec = 2 * d * ((ag_f if n >= 2 else 0) + max(0, n - 2) * b)
    return fwd, bwd, rec


def ring_attention_kernels(cp: int, seq: float) -> list[tuple[float, float, bool]]:
    """(share of the rank's attention FLOPs, sequence length, causal) of each flash-attention kernel a rank runs.

    Without CP: one causal kernel over the sequence. Under CP, torch's ring attention with round-robin load
    balancing (torch/distributed/tensor/experimental/_context_parallel/_attention.py, `_templated_ring_attention`:
    each rank holds two chunks of seq / (2 cp) tokens) runs cp kernels per pass: step 0 the rank's queries against
    its own keys, causal, over seq / cp; every later step without a mask, either all its queries against the first
    half of the arriving keys or the second half of its queries against all of them, seq / cp x seq / (2 cp). Every
    step does the same FLOPs (the causal L x L half equals L x L/2), so each has 1 / cp of them; the unmasked ones
    are priced at the non-causal rate of their shorter side, seq / (2 cp)."""
    if cp == 1:
        return [(1.0, seq, True)]
    return [(1.0 / cp, seq, True), ((cp - 1) / cp, seq / 2, False)]


def loss_bytes_per_logit(plan: Plan) -> float:
    """Bytes the loss moves per logit, forward and backward (act bytes b). Compiled: one fused kernel each way (4b).
    Eager, torch's: the fp32 upcast, log-softmax, NLL and their backward (32 + 2b). Eager, nanotron's
    sharded_cross_entropy (`--estimate.eager_loss=sharded_fp32`; nanotron 0e0a27ea, 2025-02-19, parallel/
    tensor_parallel/functional.py `_ShardedCrossEntropy`): forward the cast to fp32 (b + 4), max (4), subtract
    (4 + 4), exp in place (4 + 4), sum (4) and divide (4 + 4), the fp32 softmax saved; backward the product with the
    output gradient in place (4 + 4) and the cast back (4 + b): 48 + 2b. Eager on the logits as they come
    (`--estimate.eager_loss=bf16`): torch's without the casts, every tensor in b: log-softmax (2b), NLL's backward
    writing the dense gradient (b), log-softmax's backward (3b): 6b."""
    b = plan.act_bytes
    if plan.compile_loss:
        return 4 * b
    return {"sharded_fp32": 48 + 2 * b, "bf16": 6 * b}.get(plan.cfg.estimate.eager_loss, 32 + 2 * b)


def grad_accumulator_time(plan: Plan, r: Rates, params: float) -> float:
    """Seconds per micro-step of adding each parameter's gradient into an fp32 buffer
    (`--estimate.grad_accumulator=fp32`: nanotron's FP32GradientAccumulator, optim/gradient_accumulator.py at
    0e0a27ea, `fp32_grad.add_(half_param.grad)` per parameter after every backward): the gradient read (b), the
    buffer read and written (4 + 4), over the rank's `params`. Zero for this trainer (autograd's own .grad)."""
    if plan.cfg.estimate.grad_accumulator != "fp32":
        return 0.0
    return params * (plan.act_bytes + 8) / r.hbm


def head_pass(plan: Plan, r: Rates, tokens: float) -> Pass:
    """Final norm, output projection and loss over `tokens` tokens."""
    p, b = Pass(), plan.act_bytes
    f, bw = _linear_time(r, plan.head, tokens, plan.head_tp_shards, b)
    p.matmul = f + bw
    p.gemms = 3
    in_place = head_in_place(plan)
    if in_place is not None:  # the final norm, loss and host time as the calibration measured them in place
        p.loss = in_place * tokens
        p.fwd = f + p.loss / 2
        return p
    vocab = plan.loss_vocab  # without loss parallel every TP rank takes the loss of the whole vocabulary
    if r.loss_per_logit is not None and not plan.compile_loss:  # the eager loss as measured (calibrate.py)
        p.loss = tokens * vocab * r.loss_per_logit
    else:
        p.loss = tokens * vocab * loss_bytes_per_logit(plan) / r.hbm
        if not plan.compile_loss and plan.cfg.estimate.eager_loss != "bf16":  # the logits' `.float()`
            p.loss += tokens * vocab * upcast_extra(plan, r, 1)
    p.elementwise = 6 * b * plan.args.dim * tokens / r.hbm
    w = autocast_weight_cast_bytes(plan, [plan.head]) / r.hbm  # the output weight's cast (tied: the table's)
    p.elementwise += 2 * w + autocast_weight_grad_upcast(plan, r, [plan.head])  # the head is never compiled
    relayout = 0.0
    if plan.head_tp_shards > 1 and not plan.loss_parallel:
        # the gathered logits arrive stacked on dim 0 (NCCL's layout) and are re-laid onto the vocabulary
        # dimension: one read and one write of the whole [tokens, vocab] (_logits_gather prices the gather)
        relayout = 2 * tokens * plan.args.vocab_size * b / r.hbm
    p.elementwise += relayout
    p.fwd = f + p.loss / 2 + w + relayout
    return p


def embedding_pass(plan: Plan, r: Rates, tokens: float) -> Pass:
    """Lookup forward; backward zero-fills the table's gradient and scatters the tokens' rows into it."""
    b = plan.act_bytes
    p = Pass()
    p.elementwise = (2 * tokens * plan.args.dim * b + plan.embedding_params() * b) / r.hbm
    p.fwd = tokens * plan.args.dim * b / r.hbm
    return p


# ------------------------------------------------------------------------------------------- communication


def _ring(plan: Plan, r: Rates, nbytes: float, n: int, stride: int, kind: str = "all_gather") -> float:
    """Seconds of one ring collective (collectives.py: NCCL's latency model + bus bandwidth by topology)."""
    return collectives.ring_time(plan, r.intra, r.inter, nbytes, n, stride, kind)


def fsdp_regathers(plan: Plan) -> int:
    """How many times each block (and the embedding) is all-gathered again for backward in one FSDP round -- a
    micro-step, or under PP a schedule step of m micro-batches -- beside its one forward gather. The head (final
    norm + output) stays gathered for backward: never.

    FSDP2 frees a unit's gathered parameters after its forward when it reshards, and its backward gathers them again.
    Without PP: once when blocks reshard ("default", "always"), none with "never". Under PP the trainer keeps blocks
    gathered ("default" means "never" there, parallel/__init__.py): none. Under PP with "always" every micro-batch's
    forward frees them, while torch's pipelining keeps them gathered after each backward until the schedule's last
    (torch/distributed/pipelining/stage.py: set_reshard_after_backward(False) for every backward, then
    perform_reduce_grad reshards and reduce-scatters once): a backward that follows a forward gathers again, m of
    them a step. (In 1F1B and GPipe alike a rank gathers m + 1 times a step: its warm-up forwards gather, and the
    backwards that follow a backward do not; the count is placed as 1 forward and m backward gathers.)"""
    reshard = plan.cfg.parallelism.fsdp_reshard_after_forward
    if plan.pp_plan is None:
        return 0 if reshard == "never" else 1
    return plan.n_microbatches if reshard == "always" else 0


def fsdp_units(
    plan: Plan,
    r: Rates,
    rank: int,
    passes: list[tuple[float, float]],
    gemms: list[tuple[float, float]] | None = None,
    reduce: bool = True,
    memory: list[float] | None = None,
) -> float:
    """Exposed seconds of FSDP communication in one forward+backward of a rank's units (`reduce`: with its gradient
    reduction; False: a micro-step under no_sync, gathers only).

    `passes` lists (forward, backward) compute seconds of the rank's units in forward order. Units: embedding,
    each block, the head (norm + output), as issue 10 wraps them; the head stays gathered for backward. `gemms`
    lists each unit's (GEMM share of its compute, mean seconds of one GEMM), which matter on devices with static
    persistent GEMMs (collectives.overlap_extension); None: none. `memory` lists each unit's memory-bound share of its
    compute (neither GEMM nor attention), which loses the ring's share of the bandwidth instead of its SMs
    (collectives.overlap_hbm_share); None: none.
    """
    d, n = plan.dims, plan.fsdp_degree
    if n == 1 and d.dp_replicate == 1:
        return 0.0
    span = d.dp_shard * d.cp * d.tp
    gb = gather_bytes(plan, fp8_param_share(plan))
    n_blocks, has_emb, has_head = plan.rank_layers()[rank]
    kinds = (["emb"] if has_emb else []) + ["block"] * n_blocks + (["head"] if has_head else [])
    size = {"emb": plan.embedding_params(), "block": plan.block_params(), "head": plan.head_params()}
    # the FSDP group: dp_shard x cp ranks, tp global ranks apart
    ag = [_ring(plan, r, size[k] * (gb if k == "block" else plan.act_bytes), n, d.tp) for k in kinds]
    rs = [_ring(plan, r, size[k] * plan.reduce_bytes, n, d.tp, "reduce_scatter") for k in kinds]
    if d.dp_replicate > 1:
        # HSDP: the shard's gradients are all-reduced across replicas (span global ranks apart) after the
        # reduce-scatter
        rs = [
            x + _ring(plan, r, size[k] * plan.reduce_bytes / n, d.dp_replicate, span, "all_reduce")
            for x, k in zip(rs, kinds)
        ]
    if not reduce:
        rs = [0.0] * len(rs)
    regathers = fsdp_regathers(plan)
    ag_bwd = [a if (regathers and k != "head") else 0.0 for a, k in zip(ag, kinds)]
    if plan.hw.is_cpu:  # gloo runs on the same cores as the compute: nothing overlaps
        return sum(ag) + regathers * sum(ag_bwd) + sum(rs)
    per_kind = fsdp_gather_copy_in(plan)
    copy_in = [per_kind[k] for k in kinds]  # before each gather, on FSDP2's copy-in stream
    ci_bwd = [c if (regathers and k != "head") else 0.0 for c, k in zip(copy_in, kinds)]
    fwd = [p[0] for p in passes]
    bwd = [p[1] for p in passes]
    # an overlapped collective holds NCCL's channels' SMs, slowing the compute it overlaps (collectives.py)
    ring = collectives.busbw(plan, r.intra, r.inter, n, d.tp)
    ppn, _ = collectives.group_layout(plan, n, d.tp)
    sm = collectives.overlap_sm_share(plan, ring, r.intra, ppn >= plan.hw.devices_per_node)
    hbm = collectives.overlap_hbm_share(plan, ring)
    persistent = rates.silicon(plan.hw.name) in collectives.STATIC_PERSISTENT_GEMM_DEVICES
    gemm = gemms if (gemms is not None and persistent) else [(0.0, 0.0)] * len(passes)
    mem = memory if memory is not None else [0.0] * len(passes)
    # the share of its rate each unit's compute loses beside a ring: GEMMs and attention the SMs' share, memory-bound
    # kernels the bandwidth's; with static persistent GEMMs the GEMMs are played out apart (overlap_extension), so
    # the share is of the other kernels
    share = [
        sm + (m / (1.0 - g) if persistent and g < 1.0 else m) * (hbm - sm) for m, (g, _) in zip(mem, gemm)
    ]

    def overlap(comm: float, compute: float, unit: int, copy_in: float = 0.0) -> float:
        """Seconds a unit's compute and the collectives running beside it take beyond the compute alone: the
        compute loses the SMs the collectives hold while they run (collectives.overlap_extension), and the unit
        ends when both have ended. A unit whose collectives outlast it (communication-bound) waits for them; the
        SMs they hold then slow only compute that is not on the critical path, unless it becomes so. A gather's
        `copy_in` runs first, on its own stream: the compute beside it is delayed by
        rates.FSDP_GATHER_COPY_IN_CONTENTION of that time, and the collective starts when the copy-in ends, beside
        the compute left then."""
        beside = min(copy_in, compute)
        delay = rates.FSDP_GATHER_COPY_IN_CONTENTION * beside
        left = compute - beside + delay
        return copy_in - beside + delay + collectives.overlap_extension(comm, left, share[unit], *gemm[unit])

    order = list(range(len(kinds)))[::-1]  # backward runs the units in reverse

    def backward(reduce: list[float]) -> float:
        """Exposed seconds of one backward (the units in reverse): beside each unit's backward run the next
        unit's re-gather (prefetched) and the previous unit's reduce-scatter."""
        out = ci_bwd[order[0]] + ag_bwd[order[0]]
        for j, u in enumerate(order):
            nxt = order[j + 1] if j + 1 < len(order) else None
            prefetch, ci = (ag_bwd[nxt], ci_bwd[nxt]) if nxt is not None else (0.0, 0.0)
            out += overlap(prefetch + (reduce[order[j - 1]] if j > 0 else 0.0), bwd[u], u, ci)
        return out + reduce[order[-1]]

    exposed = copy_in[0] + ag[0]
    exposed += sum(overlap(ag[i], fwd[i - 1], i - 1, copy_in[i]) for i in range(1, len(ag)))
    exposed += backward(rs)
    # under PP with blocks resharded after forward, the other micro-batches' backwards gather them again
    return exposed + max(0, regathers - 1) * backward([0.0] * len(rs))


def fsdp_gather_copy_in(plan: Plan) -> dict[str, float]:
    """Seconds of one gather's copy-in for each kind of unit ("emb", "block", "head"): before each all-gather torch's
    fully_shard casts the rank's shard to the gathered dtype (fp32 master weights only; a float8 weight's cast is
    priced with the float8 casts) and copies it into the flat send buffer, two foreach passes over 1/n of the unit,
    at rates.FSDP_GATHER_COPY_IN_FRACTION of the part's bandwidth. It runs on FSDP2's copy-in stream
    (FSDPCommContext.all_gather_copy_in_stream, the implicit prefetches of forward and backward), beside the
    compute: fsdp_units places it before each gather. Zero where nothing is gathered and on CPU."""
    if plan.fsdp_degree == 1 or plan.hw.is_cpu:
        return dict.fromkeys(("emb", "block", "head"), 0.0)
    share = fp8_param_share(plan)
    gb, b = gather_bytes(plan, share), plan.act_bytes
    cast = plan.param_bytes + b if plan.param_bytes != b else 0.0
    block_cast = cast * (1 - share) if plan.float8_all_gather else cast
    rate = rates.FSDP_GATHER_COPY_IN_FRACTION * plan.hw.hbm_gbps * 1e9 * plan.fsdp_degree
    return {
        "emb": plan.embedding_params() * (cast + 2 * b) / rate,
        "block": plan.block_params() * (block_cast + 2 * gb) / rate,
        "head": plan.head_params() * (cast + 2 * b) / rate,
    }


def fsdp_copies(plan: Plan, r: Rates, rank: int, reduce: bool = True) -> float:
    """Seconds of FSDP2's own memory-bound copies on the compute stream in one gather-and-reduce round of a rank's
    units (`reduce`: False for a micro-step under no_sync, the gathers' copies alone), serial with the compute.

    torch's fully_shard (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py; scripts/fsdp_copy_rates.py times
    each kind in a trace):
      copy-out         after each all-gather the flat buffer is split into the unsharded parameters
                       (split_with_sizes_copy): every gathered byte read and written again, once forward and once
                       more for each backward re-gather, at the elementwise rate (r.hbm; measured 0.81-0.82 of an
                       H200's bandwidth)
      reduce copy-in   before each reduce-scatter the unsharded gradients are copied into the flat send buffer in
                       the reduce dtype (_chunk_cat: gradient bytes read, reduce-dtype bytes written), at
                       rates.FSDP_REDUCE_COPY_IN_FRACTION; recent torch runs it on the compute stream (older
                       versions on the reduce-scatter stream, where it still shares the HBM and SMs)
    The gather copy-in runs beside the compute (fsdp_gather_copy_in); the reduce-scatter's sharded output (1/n) is
    neglected.
    """
    d = plan.dims
    if (plan.fsdp_degree == 1 and d.dp_replicate == 1) or plan.hw.is_cpu:
        return 0.0
    gb = gather_bytes(plan, fp8_param_share(plan))
    n_blocks, has_emb, has_head = plan.rank_layers()[rank]
    b = plan.act_bytes
    gathers = 1 + fsdp_regathers(plan)
    blocks = n_blocks * plan.block_params()
    emb = plan.embedding_params() if has_emb else 0
    head = plan.head_params() if has_head else 0  # stays gathered for backward: one gather
    out = 0.0
    if plan.fsdp_degree > 1:  # a shard group of one (replication only) has nothing to gather
        out += 2 * (blocks * gathers * gb + emb * gathers * b + head * b) / r.hbm  # copy-out
    if reduce:
        grads = (blocks + emb + head) * (b + plan.reduce_bytes)
        out += grads / (rates.FSDP_REDUCE_COPY_IN_FRACTION * plan.hw.hbm_gbps * 1e9)
    return out


def unsharded_grad_accumulation(plan: Plan, r: Rates, params: float) -> float:
    """Seconds per optimizer step FSDP2 spends accumulating unsharded gradients over `params` (a rank's, after TP)
    where several passes reduce once (Plan.unsharded_grad_passes: PP's micro-batches, no_sync's micro-steps):
    the first pass's gradient upcast to the reduce dtype (read b, write r; none when they match), each later pass's
    added into it (read r and b, write r): _fsdp_param.py's to_accumulated_grad_if_needed and
    accumulate_unsharded_grad_if_needed, memory-bound."""
    k = plan.unsharded_grad_passes
    if k == 1:
        return 0.0
    b, red = plan.act_bytes, plan.reduce_bytes
    rounds = plan.n_microbatches * plan.accum // k
    per_round = (b + red if red != b else 0) + (k - 1) * (2 * red + b)
    return rounds * per_round * params / r.hbm


def sp_all_gather_bytes(plan: Plan) -> tuple[int, int, int, int]:
    """Bytes per element of a block's four sequence-parallel all-gathers: (attention input, feed-forward input)
    forward, (wo output gradient, w2 output gradient) backward.

    The trainer's TP plan (parallel/tensor.py) gives tensorwise Float8Linear blocks torchao's float8 TP styles
    (torchao float8/float8_tensor_parallel.py): PrepareFloat8ModuleInput casts an input to float8 e4m3 before
    the all-gather when every linear that consumes it (wq, wk, wv; w1, w3) is converted, and Float8RowwiseParallel's
    NoopFwToFloat8BwDynamic casts the gradient of wo's / w2's output to float8 e5m2 before the backward
    all-gather. Both move 1 byte per element; the reduce-scatters of the row-wise outputs (forward) and of the
    input gradients (backward) stay in the activation dtype. Not on CPU (gloo cannot carry float8: plain styles)
    nor for the rowwise recipe (torchao's float8 TP styles are tensorwise only).
    """
    b = plan.act_bytes
    if not (plan.float8 and plan.cfg.float8.recipe == "tensorwise" and not plan.hw.is_cpu):
        return b, b, b, b
    fp8 = {lin.name for lin in plan.block_linears if lin.float8}

    def size(*names: str) -> int:
        return 1 if fp8.issuperset(names) else b

    return size("wq", "wk", "wv"), size("w1", "w3"), size("wo"), size("w2")


def async_tp_unfused(plan: Plan, r: Rates, tokens: float, modes: list[str]) -> float:
    """Seconds of the TP collectives of one pass that torch's async TP leaves as plain collectives: the backward's
    reduce-scatters. Its micro-pipeline pass (torch/_inductor/fx_passes/micro_pipeline_tp.py) fuses a
    reduce-scatter only when its input is one matmul's output; in the backward graph each reduce-scatter takes the
    sum of the input gradients of wq + wk + wv (w1 + w3), "so it's not what we are looking to fuse"
    (pytorch/pytorch#149946, its author on why the pass no longer asserts a fusion per graph)."""
    if plan.tp == 1 or not plan.sequence_parallel:
        return 0.0
    rs = _ring(plan, r, tokens * plan.args.dim * plan.act_bytes, plan.tp, 1, "reduce_scatter")
    return 2 * rs * len(modes)


# A TP plan that gives each column-wise linear its own input layout (--estimate.tp_inputs=linear: ColwiseParallel on
# wq, wk, wv, w1 and w3 with no PrepareModuleInput at the attention and MLP modules, as KempnerForge's) redistributes
# the block's two inputs once per linear: each linear's input gradient comes back Partial and is reduced on its
# own, 5 backward collectives (reduce-scatters under sequence parallelism, all-reduces without) where a
# module-level plan sums the three (two) gradients first and reduces 2. Counted on this project's CPU (2 gloo
# ranks, torch 2.13, that plan on a small block; docs/estimate_log.md, "Per-linear TP inputs"): sequence parallel,
# eager 7 all-gathers + 7 reduce-scatters a forward and backward, compiled 4 + 7 (AOTAutograd's CSE merges the
# forward's identical all-gathers, not the backward's reduce-scatters of different gradients), 6 + 8 with the
# compiled recompute; without sequence parallelism 7 all-reduces, eager or compiled. A module-level plan: 4 + 4.


def tp_input_collectives(plan: Plan) -> tuple[int, int, int]:
    """(forward gathers of the attention's input, of the MLP's input, backward reductions of the two inputs'
    gradients) of one block under sequence parallelism (without it the gathers are none and the reductions
    all-reduces): 1, 1, 2 for a module-level plan; per linear (--estimate.tp_inputs=linear) one of each for every
    linear reading the input (STREAM_INPUT_LINEARS: wq, wk, wv and w1, w3), 3, 2, 5 eager and 1, 1, 5 compiled (CSE
    merges the forward's gathers of one tensor)."""
    if plan.cfg.estimate.tp_inputs != "linear":
        return 1, 1, 2
    attention = sum(1 for lin in plan.block_linears if lin.name in ATTENTION_INPUT_LINEARS)
    ffn = stream_input_casts(plan) - attention
    if plan.compile_model:
        return 1, 1, attention + ffn
    return attention, ffn, attention + ffn


def tp_block_comm(plan: Plan, r: Rates, tokens: float, mode: str) -> tuple[float, float, float]:
    """Seconds of one block's tensor-parallel collectives (before exposure): (forward, recompute, backward)."""
    if plan.tp == 1:
        return 0.0, 0.0, 0.0
    elems = tokens * plan.args.dim  # one gathered activation (sequence-parallel) or reduced one

    def coll(nbytes: float, kind: str = "all_gather") -> float:
        return _ring(plan, r, elems * nbytes, plan.tp, 1, kind)

    b = plan.act_bytes
    attn_gathers, ffn_gathers, input_grads = tp_input_collectives(plan)
    if plan.sequence_parallel:
        # forward 2 all-gathers + 2 reduce-scatters, backward the same (a module-level plan); recompute repeats
        # the forward all-gathers first, then the reduce-scatters
        attn_in, ffn_in, wo_grad, w2_grad = sp_all_gather_bytes(plan)
        fwd_ag = attn_gathers * coll(attn_in) + ffn_gathers * coll(ffn_in)
        rs = coll(b, "reduce_scatter")
        n = tp_collectives_recomputed(mode, plan.shape.recompute_stops_early)
        rec = (fwd_ag if n >= 2 else 0.0) + max(0, n - 2) * rs
        return fwd_ag + 2 * rs, rec, coll(wo_grad) + coll(w2_grad) + input_grads * rs
    # 2 all-reduces forward, 2 backward (2 more for full recompute, 1 when it stops before w2)
    ar = coll(b, "all_reduce")
    n_rec = (1 if plan.shape.recompute_stops_early else 2) if mode == "full" else 0
    return 2 * ar, n_rec * ar, input_grads * ar


def _tp_edges(plan: Plan, r: Rates, tokens: float, has_emb: bool, has_head: bool) -> float:
    """Seconds of the embedding's and the head's TP collectives in one pass (half forward, half backward). A
    replicated embedding (--estimate.tp_embedding=replicated) has no forward collective (sequence parallelism slices
    its output) and, under sequence parallelism, one backward all-gather of its output's gradient. Under sequence
    parallelism the head's input is gathered from the sequence shards whether the head is split or not; without it
    a replicated head (--estimate.tp_head=replicated) has none (its input gradient is whole on every rank)."""
    if plan.tp == 1:
        return 0.0
    kind = "all_gather" if plan.sequence_parallel else "all_reduce"
    replicated = plan.embedding_tp_shards == 1
    if plan.sequence_parallel:
        n = ((1 if replicated else 2) if has_emb else 0) + (2 if has_head else 0)
    else:  # all-reduces, forward only
        n = (0 if replicated else int(has_emb)) + int(has_head and plan.head_tp_shards > 1)
    return n * _ring(plan, r, tokens * plan.args.dim * plan.act_bytes, plan.tp, 1, kind)


def _logits_gather(plan: Plan, r: Rates, tokens: float, has_head: bool) -> float:
    """Seconds of gathering the output projection's logits in one pass under TP without loss parallel: the
    head's output layout is Replicate (parallel/tensor.py), an all-gather of the vocabulary shards forward on the
    critical path (the loss needs it); backward takes the rank's slice of the replicated gradient, no collective.
    Async TP does not fuse it (no matmul consumes it)."""
    if plan.head_tp_shards == 1 or not has_head or plan.loss_parallel:
        return 0.0
    return _ring(plan, r, tokens * plan.args.vocab_size * plan.act_bytes, plan.tp, 1, "all_gather")


def tp_embedding_grad_reduce(plan: Plan, r: Rates, has_emb: bool) -> float:
    """Seconds per pass of redistributing a TP-split embedding's weight gradient to the rank's rows: DTensor makes
    it Partial, the whole table on every TP rank (memory.embedding_backward_bytes), and reduce-scatters it over the
    TP group; once per pass in the gradients' dtype, or, where FSDP accumulates the passes unsharded (PP, no_sync),
    once per reduction on the reduce-dtype accumulator, spread over the passes. It follows the pass's last op, the
    embedding's backward, with nothing left to overlap it: exposed whole."""
    if not has_emb or plan.embedding_tp_shards == 1:  # no TP, or the table replicated on every TP rank
        return 0.0
    table = plan.embedding_grad_params()
    if not holds_unsharded_grads(plan):
        return _ring(plan, r, table * plan.act_bytes, plan.tp, 1, "reduce_scatter")
    per_reduction = _ring(plan, r, table * plan.reduce_bytes, plan.tp, 1, "reduce_scatter")
    return plan.reduce_rounds * per_reduction / (plan.n_microbatches * plan.accum)


def tp_comm(plan: Plan, r: Rates, tokens: float, modes: list[str], has_emb: bool, has_head: bool) -> float:
    """Seconds of tensor-parallel collectives in one pass over the rank's blocks (before exposure)."""
    if plan.tp == 1:
        return 0.0
    by_mode = {m: sum(tp_block_comm(plan, r, tokens, m)) for m in set(modes)}
    edges = _tp_edges(plan, r, tokens, has_emb, has_head) + _logits_gather(plan, r, tokens, has_head)
    return sum(by_mode[m] for m in modes) + edges


def async_tp_exposed_time(
    plan: Plan, r: Rates, tokens: float, modes: list[str], has_emb: bool, has_head: bool
) -> float:
    """Exposed seconds of the TP collectives of one pass under torch's async TP (docs/estimate_log.md, "Async TP,
    measured").

    The forward graph's collectives, all fused with their matmuls, stay `async_tp_exposed` of their time; in the
    backward graph the fused ones (the recompute's, the backward all-gathers) `async_tp_backward_exposed_full` in a
    fully checkpointed block and `async_tp_backward_exposed` otherwise (all three measured on the dev-discuss post's
    Figure 9, efficiency.py); the backward's reduce-scatters it cannot fuse (`async_tp_unfused`) `tp_exposed`. The
    embedding's and the head's collectives: forward as the blocks' forward, backward as a block's without recompute.
    Without sequence parallelism the collectives are all-reduces, which the pass does not fuse: as vanilla TP's.
    """
    e = plan.eff
    if not plan.sequence_parallel:  # all-reduces: the pass fuses all-gathers and reduce-scatters only
        return e.tp_exposed * tp_comm(plan, r, tokens, modes, has_emb, has_head)
    total = 0.0
    for m in set(modes):  # the blocks of one AC mode share their collectives
        fwd, rec, bwd = tp_block_comm(plan, r, tokens, m)
        unfused = async_tp_unfused(plan, r, tokens, [m])
        bwd_exposed = e.async_tp_backward_exposed_full if m == "full" else e.async_tp_backward_exposed
        per_block = e.async_tp_exposed * fwd + bwd_exposed * (rec + bwd - unfused) + e.tp_exposed * unfused
        total += modes.count(m) * per_block
    edges = _tp_edges(plan, r, tokens, has_emb, has_head) / 2
    logits = e.tp_exposed * _logits_gather(plan, r, tokens, has_head)
    return total + e.async_tp_exposed * edges + e.async_tp_backward_exposed * edges + logits


def cp_comm(plan: Plan, r: Rates, tokens: float, modes: list[str], attention_s: float) -> float:
    """Exposed seconds of context-parallel K/V exchange in one pass over the rank's blocks."""
    c = plan.cp
    if c == 1:
        return 0.0
    d = plan.dims
    kv_bytes = tokens * 2 * plan.shape.kv * plan.act_bytes * c  # K and V of the whole sequence
    per_coll = _ring(plan, r, kv_bytes, c, d.tp)
    total = 0.0
    for m in modes:
        # forward all-gather; backward gather + reduce-scatter of dK/dV; recompute gathers again
        n = 1 + 2 + (1 if recomputes_attention(m, plan.shape.op_saves_attention) else 0)
        total += n * per_coll
    if plan.cfg.parallelism.context_parallel_rotate_method == "alltoall":
        return max(0.0, total - attention_s)  # ring passes overlap the per-step attention
    return total


def pipeline_ratio(plan: Plan) -> float:
    """Bubble time as a fraction of a rank's busy time, per schedule."""
    if plan.pp_plan is None:
        return 0.0
    p, m = plan.pp, plan.n_microbatches
    v = plan.cfg.parallelism.pipeline_parallel_stages_per_rank
    ratio = (p - 1) / (v * m)
    if plan.split_backward:
        # backward-weight work fills most of the bubble (Qi et al. 2023, ZB-H1: about a third remains)
        ratio /= 3
    return ratio


def rank_params(plan: Plan, n_blocks: int, has_emb: bool, has_head: bool) -> float:
    """Parameters a rank holds: its stage's blocks, embedding and head, over the FSDP shards."""
    whole = n_blocks * plan.block_params()
    whole += (plan.embedding_params() if has_emb else 0) + (plan.head_params() if has_head else 0)
    return whole / plan.fsdp_degree


def optimizer_time(plan: Plan, r: Rates, p_local: float) -> float:
    """Seconds of the optimizer step over this rank's parameters: memory-bound passes in the parameters' dtype.
    The trainer computes the gradient norm every step (it is logged) and scales by it when training.max_norm > 0."""
    if plan.cfg.estimate.optimizer == "sgd":
        return p_local * SGD_ELEMENTS_PER_PARAM * plan.param_bytes / r.hbm
    impl = plan.cfg.optimizer.implementation
    clip = CLIP_NORM_BYTES + (CLIP_SCALE_BYTES if plan.cfg.training.max_norm > 0 else 0)
    per_param = (ADAMW_BYTES_PER_PARAM[impl] + clip) * plan.param_bytes / MASTER_BYTES
    if plan.cfg.float8.enable and plan.cfg.float8.precompute_float8_dynamic_scale_for_fsdp:
        per_param += 4
    return p_local * per_param / r.hbm


def split_backward_recomputes(plan: Plan, blocks: list[Pass], has_emb: bool) -> list[Pass]:
    """A rank's blocks with their recompute as a zero-bubble schedule runs it: torch's weight pass calls autograd
    once per parameter group (torch 2.13, pipelining/_backward.py `stage_backward_weight`; a Llama block's 7
    linears and 2 norms are 9 groups), and each call unpacks a checkpointed block again, which recomputes it to its
    last saved tensor, as the input pass did: 1 + 9 recomputes a backward. Counted with a matmul-FLOP dispatch
    mode on two debug blocks under full checkpointing: the input pass 1.75 x the forward's matmul FLOPs, the weight
    pass 7.75 x (2.75 x for a plain backward). The first stage's backward runs whole (`Plan.whole_backward_blocks`):
    one recompute. Not repeated here: the recompute's TP collectives."""
    if not plan.split_backward:
        return blocks
    first = plan.whole_backward_blocks(has_emb)
    again = 1 + len(plan.block_linears) + 2
    return blocks[:first] + [dataclasses.replace(b, recompute=b.recompute * again) for b in blocks[first:]]


def training_step_time(plan: Plan) -> dict:
    """Seconds per optimizer step on the slowest rank, with its breakdown."""
    r = Rates(plan)
    ac = plan.cfg.activation_checkpoint
    tokens = plan.tokens_per_pass
    per_rank = []
    for rank, (n_blocks, has_emb, has_head) in enumerate(plan.rank_layers()):
        modes = block_modes(ac.mode, ac.selective_ac_option, n_blocks)
        units: list[Pass] = []
        if has_emb:
            units.append(embedding_pass(plan, r, tokens))
        by_mode = {m: block_pass(plan, r, m, tokens) for m in set(modes)}  # every block of a mode is alike
        units += split_backward_recomputes(plan, [by_mode[m] for m in modes], has_emb)
        if has_head:
            units.append(head_pass(plan, r, tokens))
        accumulate = grad_accumulator_time(plan, r, rank_params(plan, n_blocks, has_emb, has_head))
        compute = sum(u.compute for u in units) + accumulate
        recompute = sum(u.recompute for u in units)
        attention = sum(u.attention for u in units)
        unit_passes = [(u.fwd, u.total - u.fwd) for u in units]
        unit_gemms = [
            (u.matmul / u.compute, u.matmul / u.gemms) if u.gemms and u.compute else (0.0, 0.0) for u in units
        ]
        unit_memory = [(u.compute - u.matmul - u.attention) / u.compute if u.compute else 0.0 for u in units]
        fsdp_exposed = fsdp_units(plan, r, rank, unit_passes, unit_gemms, memory=unit_memory)
        # under no_sync the micro-steps before the last gather without reducing
        fsdp_gather_only = (
            fsdp_units(plan, r, rank, unit_passes, unit_gemms, reduce=False, memory=unit_memory)
            if plan.reduce_rounds < plan.accum
            else 0.0
        )
        if plan.async_tp:
            tp = async_tp_exposed_time(plan, r, tokens, modes, has_emb, has_head)
        else:
            tp = plan.eff.tp_exposed * tp_comm(plan, r, tokens, modes, has_emb, has_head)
        tp += tp_embedding_grad_reduce(plan, r, has_emb)
        cp = cp_comm(plan, r, tokens, modes, attention)
        detail = {
            "matmul": sum(u.matmul for u in units),
            "attention": attention,
            "elementwise": sum(u.elementwise for u in units) + accumulate,
            "loss": sum(u.loss for u in units),
            "float8_casts": sum(u.float8_casts for u in units),
        }
        per_rank.append(
            dict(
                compute=compute,
                recompute=recompute,
                fsdp=fsdp_exposed,
                fsdp_gather_only=fsdp_gather_only,
                grad_accumulation=unsharded_grad_accumulation(
                    plan,
                    r,
                    accumulated_grad_params(
                        plan, rank_params(plan, n_blocks, has_emb, has_head) * plan.fsdp_degree, has_emb
                    ),
                ),
                tp=tp,
                cp=cp,
                detail=detail,
                n_blocks=n_blocks,
                has_emb=has_emb,
                has_head=has_head,
            )
        )

    m = plan.n_microbatches
    passes = m * plan.accum  # forward+backward passes per optimizer step on each stage chunk
    # the rank with the most work sets the pace
    # FSDP gathers once per micro-step (PP: once per schedule step) and reduces as often, or under no_sync
    # (estimate.dp_grad_sync=step) after the last micro-step only: FSDP's reduce-scatters, DDP's all-reduce
    steps, reduced = plan.accum, plan.reduce_rounds
    # FSDP2's copies and its accumulation of unsharded gradients, spread over the passes they serve (under PP they
    # also sit in the schedule's fill and drain)
    copies = [
        (
            fsdp_copies(plan, r, i) * reduced
            + fsdp_copies(plan, r, i, reduce=False) * (steps - reduced)
            + x["grad_accumulation"]
        )
        / passes
        for i, x in enumerate(per_rank)
    ]
    busy = [(x["compute"] + x["recompute"] + x["tp"] + x["cp"]) + c for x, c in zip(per_rank, copies)]
    worst = max(range(len(per_rank)), key=lambda i: busy[i])
    w = per_rank[worst]
    # every rank waits for the slowest GPU at each collective: its compute sets the pace (stragglers.py)
    straggler = stragglers.straggler_share(plan) * (w["compute"] + copies[worst] + w["recompute"]) * passes
    # the bubble is idle time of a schedule whose stages run at that pace
    bubble = pipeline_ratio(plan) * (busy[worst] * passes + straggler)
    pp_comm = 0.0
    if plan.pp_plan is not None:
        d = plan.dims
        v = plan.cfg.parallelism.pipeline_parallel_stages_per_rank
        stage_stride = d.dp_replicate * d.dp_shard * d.cp * d.tp  # global ranks between neighbouring stages
        act = tokens * plan.shape.d_s * plan.act_bytes
        send = collectives.p2p_time(plan, r.intra, r.inter, act, stage_stride)
        pp_comm = 2 * v * m * plan.accum * send
    # optimizer over the largest shard
    p_local = max(rank_params(plan, *layers) for layers in plan.rank_layers())
    opt = optimizer_time(plan, r, p_local)
    breakdown = {
        "compute": (w["compute"] + copies[worst]) * passes,
        "recompute": w["recompute"] * passes,
        "fsdp_comm_exposed": w["fsdp"] * reduced + w["fsdp_gather_only"] * (steps - reduced),
        "tp_comm_exposed": w["tp"] * passes,
        "cp_comm_exposed": w["cp"] * passes,
        "pp_comm_exposed": pp_comm,
        "pipeline_bubble": bubble,
        "optimizer": opt,
        "straggler": straggler,
    }
    measured = measured_step(plan)
    if measured is not None:  # the measured step stands; the model's terms show where it goes
        breakdown["measured_beyond_model"] = measured - sum(breakdown.values())
    detail = {k: v * passes for k, v in w["detail"].items()}
    detail["elementwise"] += (
        copies[worst] * passes
    )  # FSDP2's copy-out / copy-in: memory-bound elementwise work
    return {
        "step_time_s": sum(breakdown.values()),
        "step_time_breakdown_s": breakdown,
        "compute_detail_s": detail,
    }


def measured_step(plan: Plan) -> float | None:
    """Seconds per step of the trainer itself on this plan, from a CPU calibration's probe
    (calibrate.planned_heap_probe): its step measured in the planned world and layout with one block per stage and
    with up to three (calibrate.PROBE_DEEPER, at most the plan's), carried along the line through the two to the
    plan's number of blocks (Plan.along_probed_depths). A depth timed more than once takes the mean of its runs:
    what is estimated is the trainer's typical step, the host's slow periods included (its fastest run was biased
    low on 11 of 12 held-out rows: docs/estimate_log.md, "CPU peak memory measured at two depths: the held-out
    results"). None on GPUs, without two measured depths, or for another plan than the one probed (a search's other
    layouts)."""
    cal = plan.calibration
    return plan.along_probed_depths(cal.probe_step_s, statistics.fmean) if cal else None


def rank_step_parts(t: dict) -> dict[str, float]:
    """What one simulated rank's step (`--comm.mode=fake_backend`: real compute, collectives that return at once)
    contains, from `training_step_time`'s answer: `compute` (forward, backward and recompute, FSDP2's copy-in and
    copy-out included), `optimizer` (AdamW plus gradient clipping), `no_communication` (their sum: what a simulated
    rank should measure) and `full` (the whole step of the N-rank job, with exposed communication, the straggler
    share and any pipeline bubble; None where the hardware has no interconnect rates, as the CPU)."""
    b = t["step_time_breakdown_s"]
    compute = b["compute"] + b["recompute"]
    return {
        "compute": compute,
        "optimizer": b["optimizer"],
        "no_communication": compute + b["optimizer"],
        "full": t["step_time_s"] if math.isfinite(t["step_time_s"]) else None,
    }
