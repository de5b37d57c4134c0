"""`--estimate.calibrate`: micro-benchmarks on the devices present, replacing table values and efficiencies.

Measured, each for a fraction of a second:
  matmul        every GEMM shape the planned step runs (forward, input-gradient, weight-gradient of each linear,
                rows capped), in the run's compute dtype, and the square-GEMM peak the trainer's MFU uses on
                devices without a table entry (hardware.calibrate_tflops: the same measurement)
  attention     SDPA forward + backward at the planned head count, sequence length and head dim (causal)
  bandwidth     an elementwise add over tensors far larger than the caches: sustained memory bandwidth
  loss          the trainer's eager cross-entropy (fp32 upcast, log-softmax, NLL) forward + backward at the planned
                vocabulary and tokens: nanoseconds per logit
  block         an eager run's (no compile, no float8) transformer block as the trainer runs it -- the model's own
                TransformerBlock with this rank's tensor-parallel share of the heads and FFN, the run's dtypes
                (FSDP's bf16 parameters, or fp32 ones under autocast), its SDPA and GQA choice and CPU kernels --
                forward + backward over one planned micro-batch (sequences capped), timed in turn with its GEMMs
                and attention alone: what its norms, RoPE, SiLU, casts, copies and the host's own time (autograd,
                Python) add to its kernels
  head          the same for the final norm, output projection and the trainer's loss (no tensor parallelism)
  TP dispatch   CPU, tensor parallel: the same block parallelized by the trainer's own plan (parallel/tensor.py)
                over torch's fake process group (collectives return at once) against the plain block, in turn:
                what DTensor's dispatch, sharding propagation and redistributes cost the host per block
  collectives   all-gather and reduce-scatter between min(num_devices, present) processes (NCCL on GPUs, gloo on
                CPU), at the size of one block's parameters: bus bandwidth. On a CPU also each kind the run uses
                (all-gather, reduce-scatter, all-reduce) alone at two sizes, one pass's activation and one block's
                parameters: gloo's time per call is far from bytes over one bandwidth (its reduce-scatter of a
                megabyte takes 4 times its all-gather; a call costs ~0.5-3 ms whatever its size)
  runtime RSS   CPU only: resident memory of the trainer's runtime without a model -- the trainer's build for the
                config (imports, tokenizer, dataset, process group, metrics) and a few steps, less the model's own
                weights, gradients and AdamW moments -- measured in the planned world and layout on the planned
                model cut to one block per pipeline stage, with every tensor its own mapping; the same probe with
                glibc's defaults gives what the heap keeps at a step's peak (heap retention). Where the planned
                world does not fit this machine: the runtime alone, one process, a one-block width-64 model
With several processes every micro-benchmark runs in all of them at once (rank 0 reports), so cores, memory
bandwidth and links are shared as they will be in the run. CPU processes get the threads the launcher gives them
(torchrun: 1 thread each when there are several).

An inference estimate (`--estimate.mode=inference`) reads other rates, so `calibrate_inference` measures those on
the first device present, in this process: the square-GEMM peak (prefill), the elementwise bandwidth, the decode
step's own matmuls -- every linear of a block (its tensor-parallel share) and the head, with the planned batch as
rows, bf16 weights -- whose weight bytes over their time are the rate decode reads its weights at (on this 2-core VM
10-30 GB/s by shape against 45 GB/s of elementwise bandwidth), and, without tensor parallelism, this trainer's
own prefill and decode step (torchtitan.generate, the planned batch, weight dtype and context) at two depths. None of the
training plan's shapes is built: its batch, sequence and vocabulary are the training config's, which an inference
command does not set.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import tempfile
import time

import torch

from torchtitan.parallel.cpu_bf16 import matmul_dtype

from .plan import Calibration, Plan

_ROWS_CAP = {"cuda": 16384, "cpu": 4096}
_SEQ_CAP = {"cuda": 8192, "cpu": 2048}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_time(fn, device: torch.device, seconds: float, min_reps: int = 3) -> float:
    """Median of repeated calls (after one warm-up) within about `seconds`: the sustained rate, not the best
    moment (with several processes, the best moment is when the others happened to idle)."""
    return _median_times([fn], device, seconds, min_reps)[0]


def _median_times(fns, device: torch.device, seconds: float, min_reps: int = 3) -> list[float]:
    """`_median_time` of several functions called in turn (fns[0], fns[1], ... repeated), so that a difference
    between them is measured under the same conditions."""
    import torch.distributed as dist

    def one_round() -> list[float]:
        out = []
        for fn in fns:
            t0 = time.perf_counter()
            fn()
            _sync(device)
            out.append(time.perf_counter() - t0)
        return out

    one_round()
    # How many rounds fit in `seconds`. Every process must make the same number: fn may be a collective, and a
    # process that stopped on its own clock would leave the others waiting in one (or tear down under them).
    reps = torch.tensor([max(min_reps, int(seconds / max(sum(one_round()), 1e-9)))], device=device)
    if dist.is_initialized():
        dist.all_reduce(reps, op=dist.ReduceOp.MAX)
        dist.barrier()  # every process measures at the same time, sharing cores and memory as in the run
    rounds = [one_round() for _ in range(int(reps))]
    return [sorted(col)[len(col) // 2] for col in zip(*rounds)]


def gemm_shapes(plan: Plan) -> list[tuple[int, int, int]]:
    """Distinct (M, N, K) of the GEMMs of one planned pass: y = x W^T, dx = dy W, dW = dy^T x for every linear."""
    from .steptime import _local

    m = int(plan.tokens_per_pass)
    shapes = []
    for lin in (*plan.block_linears, plan.head):
        k, n = _local(lin, plan.tp)
        shapes += [(m, n, k), (m, k, n), (n, k, m)]
    return sorted(set(shapes))


def measure_gemm(shape, device, dtype, seconds) -> float:
    """TFLOPS of one [M,K] x [K,N] GEMM (M capped: larger ones run at the same rate)."""
    m, n, k = shape
    m = min(m, _ROWS_CAP.get(device.type, 8192))
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(m, k, device=device, dtype=dtype, generator=g)
    b = torch.randn(k, n, device=device, dtype=dtype, generator=g)
    out = torch.empty(m, n, device=device, dtype=dtype)
    t = _median_time(lambda: torch.mm(a, b, out=out), device, seconds)
    return 2 * m * n * k / t / 1e12


def measure_attention(plan: Plan, device, dtype, seconds) -> float:
    """TFLOPS of causal SDPA forward + backward, counted on the FLOPs it does (half the score matrix)."""
    s = plan.shape
    hd = plan.args.head_dim
    seq = min(plan.seq_len // plan.cp, _SEQ_CAP.get(device.type, 4096))
    batch = max(1, min(plan.microbatch_seqs, 8))
    heads, kv_heads = s.h // hd, s.kv // hd
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(batch, heads, seq, hd, device=device, dtype=dtype, generator=g, requires_grad=True)
    k = torch.randn(batch, kv_heads, seq, hd, device=device, dtype=dtype, generator=g, requires_grad=True)
    v = torch.randn(batch, kv_heads, seq, hd, device=device, dtype=dtype, generator=g, requires_grad=True)
    grad = torch.randn(batch, heads, seq, hd, device=device, dtype=dtype, generator=g)
    rep = heads // kv_heads

    def step():
        kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        out = torch.nn.functional.scaled_dot_product_attention(q, kk, vv, is_causal=True)
        out.backward(grad)

    t = _median_time(step, device, seconds)
    fwd = 4 * batch * seq * (seq / 2) * heads * hd
    return 3.5 * fwd / t / 1e12


def measure_loss(plan: Plan, device, dtype, seconds) -> float:
    """Nanoseconds per logit of the trainer's own eager loss (torchtitan.loss.cross_entropy_loss: the logits upcast
    to fp32, log-softmax and NLL) forward + backward, at the planned vocabulary (the rank's share under loss
    parallel) and the pass's tokens (rows capped). On a GPU it is memory-bound; on a CPU the exponentials and
    logarithms cost more than the bytes (docs/estimate_log.md, "The CPU step term by term")."""
    from torchtitan.loss import cross_entropy_loss

    vocab = int(plan.loss_vocab)
    # rows capped, and to 2^28 logits (~4 GB of fp32 logits, their gradients and the bf16 input): enough to be
    # measured at its sustained rate, small enough beside a large vocabulary
    rows = int(max(1, min(plan.tokens_per_pass, _ROWS_CAP.get(device.type, 8192), 2**28 // vocab)))
    g = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(1, rows, vocab, device=device, dtype=dtype, generator=g, requires_grad=True)
    labels = torch.randint(0, vocab, (1, rows), device=device, generator=g)

    def step():
        logits.grad = None
        cross_entropy_loss(logits, labels, rows).backward()

    return _median_time(step, device, seconds) / (rows * vocab) * 1e9


def _act_dtype(plan: Plan) -> torch.dtype:
    """The run's activation (compute) dtype."""
    return torch.bfloat16 if plan.act_bytes == 2 else torch.float32


def _param_dtype(plan: Plan) -> torch.dtype:
    """The dtype the run's block computes on: FSDP's bf16 parameters, or fp32 ones (and stream) under autocast."""
    return torch.float32 if plan.autocast else _act_dtype(plan)


def _fwd_bwd(plan: Plan, module, inp: torch.Tensor, out_grad: torch.Tensor, *args):
    """A function running `module`'s forward (under the run's autocast, if any) and backward from `out_grad`."""

    def run():
        for p in module.parameters():
            p.grad = None
        inp.grad = None
        with torch.autocast(inp.device.type, dtype=_act_dtype(plan), enabled=plan.autocast):
            out = module(inp, *args)
        out.backward(out_grad)

    return run


def block_sequences(plan: Plan, device_type: str) -> int:
    """Sequences of the block `measure_block` times: the planned micro-batch, capped at the GEMM rows cap (at
    least one sequence of the rank's seq_len / cp positions)."""
    seq = plan.seq_len // plan.cp
    return max(1, min(plan.microbatch_seqs, _ROWS_CAP.get(device_type, 8192) // seq))


def planned_block(plan: Plan, device: torch.device):
    """(block, input, output gradient, RoPE table) of one transformer block as the trainer runs it eagerly on this
    rank: the model's TransformerBlock with the rank's tensor-parallel share of the heads and FFN (a plain block:
    no DTensor, no collective; those are priced apart), parameters in the run's dtype (bf16 under FSDP, fp32 under
    autocast), the trainer's GQA choice and CPU bf16 kernels, over `block_sequences` sequences of seq_len / cp
    positions."""
    from torch import nn

    from torchtitan.models.llama3.model import TransformerBlock, precompute_freqs_cis
    from torchtitan.parallel.attention import native_gqa_supported
    from torchtitan.parallel.cpu_bf16 import use_cpu_bf16_kernels

    a, s = plan.args, plan.shape
    act_dtype, param_dtype = _act_dtype(plan), _param_dtype(plan)
    seq, seqs = plan.seq_len // plan.cp, block_sequences(plan, device.type)
    torch.manual_seed(0)
    block = TransformerBlock(0, dataclasses.replace(a, n_layers=1, max_seq_len=seq))
    attn, ffn = block.attention, block.feed_forward
    attn.wq, attn.wk, attn.wv = (nn.Linear(a.dim, n, bias=False) for n in (s.h, s.kv, s.kv))
    attn.wo = nn.Linear(s.h, a.dim, bias=False)
    ffn.w1, ffn.w3 = nn.Linear(a.dim, s.f, bias=False), nn.Linear(a.dim, s.f, bias=False)
    ffn.w2 = nn.Linear(s.f, a.dim, bias=False)
    block.to(device=device, dtype=param_dtype)
    enabled = plan.cfg.training.cpu_bf16_fp32_kernels
    if attn.n_rep > 1:
        attn.native_gqa = native_gqa_supported(
            device.type, matmul_dtype(device.type, act_dtype, enabled), a.head_dim
        )
    use_cpu_bf16_kernels(block, device.type, act_dtype, enabled)
    freqs = precompute_freqs_cis(dataclasses.replace(a, max_seq_len=seq)).to(device)
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(seqs, seq, a.dim, device=device, dtype=param_dtype, generator=g, requires_grad=True)
    grad = torch.randn(seqs, seq, a.dim, device=device, dtype=param_dtype, generator=g)
    return block, x, grad, freqs


def measure_block(plan: Plan, device: torch.device, seconds: float) -> tuple[float, float, int]:
    """(seconds of the block, seconds of its GEMMs and attention alone, tokens): `planned_block`'s forward +
    backward, timed in turn with the same GEMMs and attention kernel called alone on ready operands
    (`block_kernels`). The difference is what the block costs beyond its kernels: its norms, RoPE, SiLU, casts and
    copies, the host's own time (autograd, Python), the kernels' slowdown in place."""
    block, x, grad, freqs = planned_block(plan, device)
    gqa = block.attention.n_rep > 1 and block.attention.native_gqa
    kernels = block_kernels(plan, device, x.shape[0], gqa)
    t_block, t_kernels = _median_times([_fwd_bwd(plan, block, x, grad, freqs), kernels], device, seconds)
    return t_block, t_kernels, x.shape[0] * x.shape[1]


def measure_tp_dispatch(plan: Plan, mesh, seconds: float) -> float:
    """Seconds one tensor-parallel block's forward + backward takes beyond `planned_block` (the same rank's share on
    plain tensors): the trainer's TP plan (parallel/tensor.py: DTensor parameters, the input and output layouts,
    sequence-parallel norms) applied to a one-block model over `mesh` -- a mesh of torch's fake process group,
    whose collectives return at once (their time is priced from the measured collectives) -- timed in turn with
    the plain block. What remains is the host's cost of DTensor: dispatch and sharding propagation per op, the
    redistributes' bookkeeping and layout copies."""
    from torchtitan.models.llama3.model import Transformer
    from torchtitan.parallel.attention import apply_gqa_choice
    from torchtitan.parallel.cpu_bf16 import use_cpu_bf16_kernels
    from torchtitan.parallel.tensor import apply_tp

    device = torch.device("cpu")
    torch.set_flush_denormal(True)  # the fake collectives' outputs are whatever memory held: keep them fast
    plain, x, grad, freqs = planned_block(plan, device)
    act_dtype = _act_dtype(plan)
    seq = plan.seq_len // plan.cp
    with torch.device("meta"):
        model = Transformer(dataclasses.replace(plan.args, n_layers=1, max_seq_len=seq))
    enabled = plan.cfg.training.cpu_bf16_fp32_kernels
    use_cpu_bf16_kernels(model, "cpu", act_dtype, enabled)
    apply_gqa_choice(model, "cpu", matmul_dtype("cpu", act_dtype, enabled))
    apply_tp(model, mesh, plan.sequence_parallel, plan.loss_parallel, float8_styles=False)
    model.to_empty(device=device)
    model.to(dtype=x.dtype)
    with torch.no_grad():
        for p in model.parameters():
            getattr(p, "_local_tensor", p).normal_(0.0, 0.02)
    block = model.layers["0"]
    stream = seq // plan.tp if plan.sequence_parallel else seq  # the residual stream's positions on this rank
    xt = torch.randn(x.shape[0], stream, x.shape[2], dtype=x.dtype, requires_grad=True)
    gt = torch.randn(x.shape[0], stream, x.shape[2], dtype=x.dtype)
    steps = [_fwd_bwd(plan, block, xt, gt, freqs), _fwd_bwd(plan, plain, x, grad, freqs)]
    t_tp, t_plain = _median_times(steps, device, seconds)
    return t_tp - t_plain


def _tp_dispatch_worker(rank: int, plan: Plan, seconds: float, threads: int, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch.set_num_threads(threads)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=plan.tp)
    try:
        torch.save(measure_tp_dispatch(plan, init_device_mesh("cpu", (plan.tp,)), seconds), out)
    finally:
        dist.destroy_process_group()


def tp_dispatch_s(plan: Plan, seconds: float, threads: int) -> float | None:
    """`measure_tp_dispatch` in a process of its own (a fake process group of the TP degree, with the run's
    threads); None where it does not apply (no tensor parallelism, or a compiled or float8 run) or when that
    process fails (the estimate then prices no DTensor host time, and the calibration's notes say so)."""
    if plan.tp == 1 or not plan.block_measurable:
        return None
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "tp.pt")
        try:
            mp.spawn(_tp_dispatch_worker, args=(plan, seconds, threads, out), nprocs=1)
        except Exception:  # the probe's own failure (torch.multiprocessing re-raises it here): not the run's
            return None
        return float(torch.load(out))


def measure_head(plan: Plan, device: torch.device, seconds: float) -> tuple[float, float]:
    """(seconds of the head, seconds of its GEMMs alone): the final RMSNorm, the output projection (the tied
    embedding's table alike) and the trainer's loss (torchtitan.loss.cross_entropy_loss: fp32 upcast, log-softmax,
    NLL), forward + backward, in the run's dtypes and CPU kernels, over `block_sequences` sequences -- timed in turn
    with the projection's three GEMMs alone. The difference is the norm, the loss and the host's time as they run
    in the step (the loss alone, on logits made beforehand, measured a third of that on this CPU: docs/estimate_log.md,
    "The block and the head in place")."""
    from torch import nn

    from torchtitan.loss import cross_entropy_loss
    from torchtitan.parallel.cpu_bf16 import use_cpu_bf16_kernels

    a = plan.args
    act_dtype, param_dtype = _act_dtype(plan), _param_dtype(plan)
    seq, seqs = plan.seq_len // plan.cp, block_sequences(plan, device.type)
    torch.manual_seed(0)
    head = nn.Sequential(nn.RMSNorm(a.dim, eps=a.norm_eps), nn.Linear(a.dim, a.vocab_size, bias=False))
    head.to(device=device, dtype=param_dtype)
    use_cpu_bf16_kernels(head, device.type, act_dtype, plan.cfg.training.cpu_bf16_fp32_kernels)
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(seqs, seq, a.dim, device=device, dtype=param_dtype, generator=g, requires_grad=True)
    labels = torch.randint(0, a.vocab_size, (seqs, seq), device=device, generator=g)

    def step():
        for p in head.parameters():
            p.grad = None
        x.grad = None
        with torch.autocast(device.type, dtype=act_dtype, enabled=plan.autocast):
            logits = head(x)
        cross_entropy_loss(
            logits, labels, seqs * seq
        ).backward()  # the loss upcasts outside autocast, as in the step

    dtype = matmul_dtype(device.type, act_dtype, plan.cfg.training.cpu_bf16_fp32_kernels)
    gemms = _gemm_operands([(seqs * seq, a.dim, a.vocab_size)], device, dtype, g)

    def kernels():
        for lhs, rhs, out in gemms:
            torch.mm(lhs, rhs, out=out)

    t_head, t_kernels = _median_times([step, kernels], device, seconds)
    return t_head, t_kernels


def _gemm_operands(linears, device, dtype, g) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(A, B, out) of the three GEMMs of each (rows, in, out features) linear: y = x W^T, dx = dy W, dW = dy^T x."""
    out = []
    for m, k, n in linears:
        for rows, inner, cols in ((m, k, n), (m, n, k), (n, m, k)):
            a = torch.randn(rows, inner, device=device, dtype=dtype, generator=g)
            b = torch.randn(inner, cols, device=device, dtype=dtype, generator=g)
            out.append((a, b, torch.empty(rows, cols, device=device, dtype=dtype)))
    return out


def block_kernels(plan: Plan, device: torch.device, seqs: int, gqa: bool):
    """A function running one block's GEMMs (each linear's forward, input gradient and weight gradient) and its
    attention forward + backward (SDPA, causal, natively grouped or on repeated K/V as `gqa` says) for `seqs`
    sequences of seq_len / cp positions, on operands made beforehand, in the dtype the run's kernels compute in
    (the calibration's GEMM table's)."""
    from .steptime import _local

    dtype = matmul_dtype(device.type, _act_dtype(plan), plan.cfg.training.cpu_bf16_fp32_kernels)
    g = torch.Generator(device=device).manual_seed(1)
    seq = plan.seq_len // plan.cp
    gemms = _gemm_operands(
        [(seqs * seq, *_local(lin, plan.tp)) for lin in plan.block_linears], device, dtype, g
    )
    s, hd = plan.shape, plan.args.head_dim
    heads = s.h // hd
    # without native GQA, repeat_kv's copies of K and V are made beforehand: they are the block's own work
    kv_heads = s.kv // hd if gqa else heads

    def leaf(h: int) -> torch.Tensor:
        return torch.randn(seqs, h, seq, hd, device=device, dtype=dtype, generator=g, requires_grad=True)

    q, k, v = leaf(heads), leaf(kv_heads), leaf(kv_heads)
    grad = torch.randn(seqs, heads, seq, hd, device=device, dtype=dtype, generator=g)

    def run():
        for a, b, out in gemms:
            torch.mm(a, b, out=out)
        q.grad = k.grad = v.grad = None
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa).backward(
            grad
        )

    return run


def measure_bandwidth(device, dtype, seconds) -> float:
    """GB/s of c = a + b over tensors much larger than the caches (3 tensors moved)."""
    n = (256 if device.type == "cuda" else 32) * 2**20
    a = torch.ones(n, device=device, dtype=dtype)
    b = torch.ones(n, device=device, dtype=dtype)
    c = torch.empty(n, device=device, dtype=dtype)
    t = _median_time(lambda: torch.add(a, b, out=c), device, seconds)
    return 3 * n * a.element_size() / t / 1e9


def measure_collectives(plan: Plan, device, seconds) -> float | None:
    """Bus bandwidth (GB/s) of all-gather + reduce-scatter at one block's size; None in a single process."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    world = dist.get_world_size()
    cap = 256 * 2**20 if device.type == "cuda" else 32 * 2**20
    numel = int(min(plan.block_params() * plan.act_bytes, cap) // (2 * world) * world)
    full = torch.ones(numel, device=device, dtype=torch.bfloat16)
    shard = torch.empty(numel // world, device=device, dtype=torch.bfloat16)

    def both():
        dist.all_gather_into_tensor(full, shard)
        dist.reduce_scatter_tensor(shard, full)

    t = _median_time(both, device, seconds)
    moved = 2 * numel * 2 * (world - 1) / world
    return moved / t / 1e9


def measure_collective_sizes(plan: Plan, device, seconds) -> list[list]:
    """[kind, processes, bytes, seconds] of all-gather, reduce-scatter and all-reduce alone, each at one pass's
    activation ([tokens, dim] in the run's dtype: tensor parallelism's message) and at one block's parameters
    (FSDP's; both capped at 32 MB, the smaller at most 1/4 of the larger): what collectives.ring_time reads on a
    CPU, linear in bytes between and beyond the two sizes. Empty in a single process."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return []
    world = dist.get_world_size()
    cap = 32 * 2**20
    large = int(min(plan.block_params() * plan.act_bytes, cap))
    small = int(min(plan.tokens_per_pass * plan.args.dim * plan.act_bytes, large / 4))
    out = []
    for nbytes in (small, large):
        numel = max(world, nbytes // 2 // world * world)  # bf16 elements, a multiple of the world
        full = torch.ones(numel, device=device, dtype=torch.bfloat16)
        shard = torch.empty(numel // world, device=device, dtype=torch.bfloat16)
        calls = {
            "all_gather": lambda f=full, s=shard: dist.all_gather_into_tensor(f, s),
            "reduce_scatter": lambda f=full, s=shard: dist.reduce_scatter_tensor(s, f),
            "all_reduce": lambda f=full: dist.all_reduce(f),
        }
        for kind, fn in calls.items():
            out.append([kind, world, numel * 2, _median_time(fn, device, seconds / 3)])
    return out


# The trainer's own build and a few steps, in a fresh process (or, under torchrun, the planned world): what stays
# resident is the runtime -- imports, tokenizer, dataset, process group, logger, metrics, and the code and data
# pages of the kernels a step runs (oneDNN, SDPA, the optimizer), which a process that only imports never touches
# (docs/estimate_log.md, "CPU resident memory"). Two forms (PROBE_FORM):
#   tiny     a one-block width-64 model, one 16-token sequence, one process: the runtime alone
#   planned  the planned model, world and layout with one block per pipeline stage: the runtime in the planned
#            world (process group, FSDP/DTensor state) and, run once with glibc's defaults and once with every
#            tensor its own mapping (MALLOC_MMAP_THRESHOLD_), what glibc's heap keeps at the peak of a step
#            ("CPU resident memory of multi-process runs", docs/estimate_log.md)
# Rank 0 prints: the resident memory after the steps less the model's own weights, gradients and AdamW moments
# (the runtime), and the peak of the steps (VmHWM, reset after the build).
_LAUNCHER_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "MALLOC_MMAP_THRESHOLD_",
)
_TINY = [
    "--model.dim=64", "--model.n_layers=1", "--model.n_heads=4", "--model.n_kv_heads=1",
    "--model.ffn_hidden_dim=256", "--training.local_batch_size=1", "--training.seq_len=16",
    "--training.global_batch_size=-1", "--parallelism.data_parallel_replicate_degree=1",
    "--parallelism.data_parallel_shard_degree=-1", "--parallelism.tensor_parallel_degree=1",
    "--parallelism.pipeline_parallel_degree=1", "--parallelism.context_parallel_degree=1",
]  # fmt: skip
_PROBE_STEPS = {"tiny": 2, "planned": 12}
PROBE_DEEPER = 3  # blocks a stage of the probe's second timed depth, at most the plan's
PROBE_TIMINGS = 2  # timed runs of each depth, in turn (planned_heap_probe)
_RUNTIME_PROBE = """
import os, statistics, sys, time
common = ["--checkpoint.enable=false", "--comm.mode=default", "--job.dump_folder=" + os.environ["PROBE_DIR"]]
from torchtitan.build import build_metrics, build_run, initialize_weights
from torchtitan.config import parse_args
from torchtitan.loss import forward_backward
from torchtitan.optim import clip_grad_norm_, init_optimizer_state
from torchtitan.parallel import reduce_partial_grads
cfg = parse_args(sys.argv[1:] + common)
run = build_run(cfg)
initialize_weights(run.model_parts, cfg.training.seed)
init_optimizer_state(run.optimizer)
metrics = build_metrics(run, 0)  # the MFU peak's calibration matmul where no table entry exists, the loggers
data = iter(run.dataloader)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # VmHWM := the current resident set: the peak below is the steps'
times = []  # seconds of each step, as the trainer's loop runs it
for _ in range(int(os.environ["PROBE_STEPS"])):
    started = time.perf_counter()
    run.optimizer.zero_grad(set_to_none=True)
    for _ in range(run.accum_steps):
        inputs, labels = next(data)
        with run.cp_context(inputs, labels):  # as the trainer's step: context parallel shards them, else a no-op
            forward_backward(run.model_parts, inputs, labels, run.global_tokens, run.loss_context, run.pp,
                             run.loss_fn)
    reduce_partial_grads(run.model_parts)
    clip_grad_norm_([p for part in run.model_parts for p in part.parameters()], cfg.training.max_norm,
                    pp_mesh=run.dims.mesh("pp") if run.dims.pp_enabled else None)
    run.optimizer.step()
    times.append(time.perf_counter() - started)
# the probe model's own weights, gradients and AdamW moments are not runtime (with a large vocabulary they are not
# small: the embedding and head keep the tokenizer's vocabulary)
def nbytes(t):
    t = getattr(t, "_local_tensor", t)  # a DTensor's shard on this rank
    return t.numel() * t.element_size()
params = [p for part in run.model_parts for p in part.parameters()]
own = sum(nbytes(p) + (nbytes(p.grad) if p.grad is not None else 0) for p in params)
own += sum(nbytes(v) for st in run.optimizer.state.values() for v in st.values() if hasattr(v, "numel"))
rss = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
hwm = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
if int(os.environ.get("RANK", "0")) == 0:
    # the step time: the median of the steps after the first third (allocations, first-touch pages, one-time setup)
    print(rss - own, max(hwm, rss), statistics.median(times[len(times) // 3:]))
"""


def _run_probe(
    argv: list[str], threads: int | None, world: int = 1, form: str = "tiny", mmapped: bool = False
) -> tuple[float, float, float] | None:
    """Run the probe (`form`: "tiny" or "planned", its `argv` already shaped) in `world` processes; rank 0's
    (runtime GiB, peak GiB of the steps, seconds per step), or None when it fails. `mmapped`: every tensor of
    128 KiB or more its own mapping (glibc's MALLOC_MMAP_THRESHOLD_), returned to the system when freed."""
    # a world of its own, whatever launcher started the caller
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS}
    env["HF_DATASETS_OFFLINE"] = os.environ.get("HF_DATASETS_OFFLINE", "1")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    if mmapped:  # a malloc setting: the trainer then leaves malloc alone (runtime_env), large weights too
        env["MALLOC_MMAP_THRESHOLD_"] = "131072"
    env["PROBE_STEPS"] = str(_PROBE_STEPS[form])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as tmp:
        env["PROBE_DIR"] = tmp
        script = os.path.join(tmp, "probe.py")
        with open(script, "w") as f:
            f.write(_RUNTIME_PROBE)
        # the ranks started here as torchrun would start them (its launcher process would import torch once more)
        if world > 1:
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(world))
            env["LOCAL_WORLD_SIZE"] = str(world)
        procs = [
            subprocess.Popen(
                [sys.executable, script, *argv],
                stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL,  # rank 0 reports
                stderr=subprocess.DEVNULL,
                text=True,
                env={**env, "RANK": str(r), "LOCAL_RANK": str(r)} if world > 1 else env,
            )
            for r in range(world)
        ]
        try:
            out = procs[0].communicate(timeout=600)[0]
            codes = [p.wait(timeout=60) for p in procs]
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
                p.wait()
            return None
    if any(codes):
        return None
    runtime, peak, step_s = (float(x) for x in out.strip().splitlines()[-1].split())
    return runtime / 2**30, peak / 2**30, step_s


def runtime_rss_gib(argv: list[str], threads: int | None = None) -> float | None:
    """Resident memory of a fresh process holding the trainer's runtime but (almost) no model: the trainer's build
    for the config (imports, tokenizer, dataset, process group, metrics) and two steps of a one-block width-64
    model, which page in the kernels a step runs, less that model's own tensors -- the CPU baseline under a run's
    own tensors. `threads`: the run's threads per process (per-thread kernel buffers), default the caller's."""
    r = _run_probe([*argv, *_TINY], threads)
    return None if r is None else r[0]


def planned_heap_probe(
    argv: list[str], threads: int | None, world: int, blocks: int, deeper: int | None = None
) -> dict | None:
    """The probe on the planned model, world and layout with `blocks` transformer blocks (one per pipeline stage),
    twice: with every tensor its own mapping (the runtime in the planned world, and the steps' tensor peak above
    it) and with glibc's defaults (the same peak plus what the heap keeps: freed blocks that later requests do not
    fit, which stay resident). GiB; None when either run fails.

    The second run is the trainer's own malloc regime, and its steps are timed: the trainer's whole step as it runs
    in the planned world (host time, optimizer, collectives and their waits included) with one block per stage.
    With `deeper`, the same is timed with `deeper` blocks, then each depth once more, in turn (deeper, one a stage,
    deeper: PROBE_TIMINGS runs a depth), so that a slow period of the host does not set a depth's time alone;
    `probe_step_s` holds [n_layers, seconds per step] of every timed run that did not fail, for
    steptime.measured_step, and `probe_rss_gib` [n_layers, rank 0's peak GiB of the steps] of the same runs, for
    memory.measured_rss."""
    shaped = [*argv, f"--model.n_layers={blocks}"]
    mapped = _run_probe(shaped, threads, world, "planned", mmapped=True)
    heap = _run_probe(shaped, threads, world, "planned") if mapped else None
    if heap is None:
        return None
    timed, peaks = [[blocks, heap[2]]], [[blocks, heap[1]]]
    for depth in ([deeper, blocks] * PROBE_TIMINGS)[: 2 * PROBE_TIMINGS - 1] if deeper else []:
        run = _run_probe([*argv, f"--model.n_layers={depth}"], threads, world, "planned")
        if run is not None:
            timed.append([depth, run[2]])
            peaks.append([depth, run[1]])
    runtime, peak, _ = mapped
    return {
        "runtime_rss_gib": runtime,
        "probe_tensors_gib": peak - runtime,
        "heap_retention_gib": max(0.0, heap[1] - peak),
        "probe_step_s": timed,
        "probe_rss_gib": peaks,
    }


def _in_place_window(plan: Plan, device: torch.device, seconds: float) -> tuple:
    """One window of the in-place timings: (measure_block's, measure_head's), None where one does not apply."""
    block = measure_block(plan, device, seconds) if plan.block_measurable else None
    head = measure_head(plan, device, seconds) if plan.head_measurable else None
    return block, head


def median_window(windows: list[tuple]) -> tuple:
    """The window (seconds in place, seconds of the kernels alone, ...) whose surplus over the kernels is the
    median of the windows'."""
    ranked = sorted(windows, key=lambda w: w[0] - w[1])
    return ranked[len(ranked) // 2]


def _measure_all(plan: Plan, device: torch.device, seconds: float) -> Calibration:
    from torchtitan.metrics.hardware import calibrate_tflops

    # the kernels such a run uses (fp32 for bf16 on a CPU without bf16 instructions: parallel/cpu_bf16.py)
    act_dtype = _act_dtype(plan)  # the logits the loss reads
    dtype = matmul_dtype(device.type, act_dtype, plan.cfg.training.cpu_bf16_fp32_kernels)
    cal = Calibration(device=str(device))
    # The block and the head are timed in three windows spread over the calibration (its start, middle and end), and
    # the window with the median surplus over the kernels is kept: one window was timed 1.8x slow by a burst on the
    # host while every other measurement of that calibration agreed with later ones (docs/estimate_log.md, "The
    # block and the head in place: the held-out results"). Each window takes a third of the time one would.
    windows = [_in_place_window(plan, device, seconds / 3)]
    cal.matmul_peak_tflops = calibrate_tflops(device, dtype, seconds=seconds)
    for shape in gemm_shapes(plan):
        cal.matmul_tflops[shape] = measure_gemm(shape, device, dtype, seconds / 4)
    windows.append(_in_place_window(plan, device, seconds / 3))
    cal.attention_tflops = measure_attention(plan, device, dtype, seconds)
    cal.hbm_gbps = measure_bandwidth(device, dtype, seconds)
    cal.loss_ns_per_logit = measure_loss(plan, device, act_dtype, seconds)
    cal.collective_gbps = measure_collectives(plan, device, seconds)
    if device.type == "cpu":
        cal.collective_s = measure_collective_sizes(plan, device, seconds)
    windows.append(_in_place_window(plan, device, seconds / 3))
    if plan.block_measurable:
        cal.block_s, cal.block_kernels_s, cal.block_tokens = median_window([w[0] for w in windows])
    if plan.head_measurable:
        cal.head_s, cal.head_kernels_s = median_window([w[1] for w in windows])
    return cal


def _worker(
    rank: int, world: int, port: int, plan: Plan, device_type: str, seconds: float, threads: int, out: str
):
    import torch.distributed as dist

    if device_type == "cpu":
        torch.set_num_threads(threads)
        device = torch.device("cpu")
    else:
        device = torch.device(device_type, rank)
        torch.cuda.set_device(device)
    dist.init_process_group(
        "gloo" if device_type == "cpu" else "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
    )
    try:
        cal = _measure_all(plan, device, seconds)
        if rank == 0:
            torch.save(cal.__dict__, out)
    finally:
        dist.destroy_process_group()


def _probe_fits(plan: Plan) -> bool:
    """Whether the planned probe (one block per stage, the planned batch and vocabulary) surely fits: the whole
    plan's tensors, an upper bound on the probe's, within a quarter of this machine's memory."""
    from torchtitan.metrics.memory import device_memory_gib

    from .memory import rank_memory

    tensors = max(
        sum(v for k, v in rank_memory(plan, r).items() if k != "allocator_and_comm_overhead")
        for r in range(plan.pp if plan.pp_plan is not None else 1)
    )
    return tensors / 2**30 <= device_memory_gib("cpu") / 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure_decode_matmuls(model_args, batch: int, tp: int, device, seconds: float) -> float:
    """GB/s at which one decode step's matmuls read their bf16 weights: each linear of a block (its `tp` share:
    column-parallel outputs and row-parallel inputs split) and the head, `batch` rows each, timed in turn; the
    weight bytes of n_layers blocks and the head over n_layers x the block's time plus the head's."""
    from .plan import model_linears

    block, head = model_linears(model_args, 16)
    g = torch.Generator(device=device).manual_seed(0)

    def operands(lin, split: bool):
        k, n = lin.in_features, lin.out_features
        if split:
            k, n = (k, n // tp) if lin.colwise else (k // tp, n)
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16, generator=g)
        return torch.randn(batch, k, device=device, dtype=torch.bfloat16, generator=g), w

    pairs = [operands(lin, True) for lin in block]
    x_head, w_head = operands(head, False)
    t_block = _median_time(lambda: [torch.nn.functional.linear(x, w) for x, w in pairs], device, seconds)
    t_head = _median_time(lambda: torch.nn.functional.linear(x_head, w_head), device, seconds)
    layers = model_args.n_layers
    nbytes = layers * sum(w.numel() for _, w in pairs) * 2 + w_head.numel() * 2
    return nbytes / (layers * t_block + t_head) / 1e9


DECODE_DEPTHS = (1, 3)  # blocks of the generation probe (measure_generation), at most the model's
DECODE_PROBE_TOKENS = 8  # tokens each of its generate calls makes
DECODE_PROBE_CALLS = 3  # its timed generate calls at each depth (after one untimed)


def decode_probe_depths(model_args) -> list[int]:
    """The depths the generation probe cuts the model to: DECODE_DEPTHS, each at most the model's."""
    return sorted({min(d, model_args.n_layers) for d in DECODE_DEPTHS})


def decode_probe_gib(model_args, depth: int) -> float:
    """The generation probe's weights at `depth` blocks, in bf16 (an upper bound for quantized weights)."""
    a = model_args
    tables = a.vocab_size * a.dim * (1 if a.tie_embeddings else 2)  # the embedding (and an untied output)
    per_block = (a.num_params() - tables - a.dim) / a.n_layers  # the blocks' parameters, norms included
    return (depth * per_block + tables) * 2 / 2**30


def decode_probe_refusal(model_args, weight_dtype: str, device) -> str | None:
    """Why the decode probe cannot run on `device` (None: it can): the weight dtype has no kernel there (int4 outside
    CUDA), or its models' weights (every depth, held together) would exceed a quarter of the device's memory."""
    from torchtitan.errors import UserError
    from torchtitan.generate.loader import check_quantize
    from torchtitan.metrics.memory import device_memory_gib

    try:
        check_quantize(None if weight_dtype == "bfloat16" else weight_dtype, device, torch.bfloat16)
    except UserError:
        return f"{weight_dtype} weights have no kernel on {device.type}"
    gib = sum(decode_probe_gib(model_args, d) for d in decode_probe_depths(model_args))
    if gib > device_memory_gib(device) / 4:
        return f"its {gib:.1f} GiB of weights exceed a quarter of the {device.type}'s memory"
    return None


def measure_generation(
    model_args,
    batch: int,
    prompt_len: int,
    gen_len: int,
    weight_dtype: str,
    compile: bool,
    device,
    cpu_bf16_fp32_kernels: bool = True,
) -> tuple[list[list], list[list]]:
    """This trainer's own generation (torchtitan.generate: the model's KV cache, its sampling, the weights quantized
    as generation quantizes them) on `device`, with the planned batch and weights and random ones, at the depths of
    DECODE_DEPTHS: ([[n_layers, seconds a decode step], ...], [[n_layers, seconds of the prefill], ...]). A decode
    step is the median step of DECODE_PROBE_CALLS generate calls whose context centres on prompt_len + gen_len / 2
    (the mean context of the planned generation); the prefill, the median of as many forwards over the planned
    prompts. The depths' models are held together and timed in turn. The caller checks decode_probe_refusal first."""
    import statistics

    from torchtitan.generate import generate, make_decode_step, quantize_weights
    from torchtitan.models.llama3 import Transformer
    from torchtitan.parallel.cpu_bf16 import use_cpu_bf16_kernels

    mode = None if weight_dtype == "bfloat16" else weight_dtype
    depths = decode_probe_depths(model_args)
    prompt = max(1, prompt_len + gen_len // 2 - DECODE_PROBE_TOKENS // 2)
    cache_len = prompt + DECODE_PROBE_TOKENS
    models, steps, forwards = [], {d: [] for d in depths}, {d: [] for d in depths}
    for depth in depths:
        args = dataclasses.replace(model_args, n_layers=depth, max_seq_len=max(cache_len, prompt_len + 1))
        with torch.device("meta"):
            model = Transformer(args)
        model.to_empty(device=device)
        with torch.no_grad():
            model.init_weights()
        model = model.to(torch.bfloat16).eval().requires_grad_(False)
        quantize_weights(model, mode)
        use_cpu_bf16_kernels(model, device.type, torch.bfloat16, cpu_bf16_fp32_kernels)
        models.append((depth, model, make_decode_step(model, compile=compile)))
    # the depths in turn, call by call (as the training probe does): a host that slows for a while slows both
    for call in range(DECODE_PROBE_CALLS + 1):  # the first call of each kind warms up (and compiles)
        for depth, model, step in models:
            g = generate(model, [[1] * prompt] * batch, DECODE_PROBE_TOKENS, eos_id=-1, decode_step=step,
                         cache_len=cache_len, static_shapes=compile)  # fmt: skip
            f = generate(model, [[1] * prompt_len] * batch, 1, eos_id=-1)
            if call:
                steps[depth] += g.decode_s
                forwards[depth].append(f.prefill_s)
    decode = [[d, statistics.median(steps[d])] for d in depths]
    prefill = [[d, statistics.median(forwards[d])] for d in depths]
    del models
    return decode, prefill


def calibrate_inference(
    model_args,
    batch: int,
    tp: int,
    prompt_len: int = 1,
    gen_len: int = 1,
    weight_dtype: str = "bfloat16",
    compile: bool = False,
    seconds: float = 0.3,
    cpu_bf16_fp32_kernels: bool = True,
) -> Calibration:
    """The rates an inference estimate reads (inference.py), measured on the first device present in this process:
    the square-GEMM peak (prefill's compute), the elementwise bandwidth, the rate the decode step's own matmuls read
    their weights at (measure_decode_matmuls), and, without tensor parallelism, this trainer's own prefill and decode
    step at two depths (measure_generation)."""
    from torchtitan.metrics.hardware import calibrate_tflops

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    dtype = matmul_dtype(device.type, torch.bfloat16, cpu_bf16_fp32_kernels)
    cal = Calibration(device=str(device))
    cal.matmul_peak_tflops = calibrate_tflops(device, dtype, seconds=seconds)
    cal.hbm_gbps = measure_bandwidth(device, dtype, seconds)
    cal.decode_gbps = measure_decode_matmuls(model_args, batch, tp, device, seconds)
    threads = f", {torch.get_num_threads()} thread(s)" if device.type == "cpu" else ""
    cal.notes = [f"1 process on {device.type}{threads}, the rates inference reads"]
    if tp == 1:
        why = decode_probe_refusal(model_args, weight_dtype, device)
        if why is None:
            cal.decode_step_s, cal.prefill_s = measure_generation(
                model_args, batch, prompt_len, gen_len, weight_dtype, compile, device, cpu_bf16_fp32_kernels
            )
        else:
            cal.notes.append(f"generation not probed ({why}): priced by its bytes and FLOPs")
    return cal


def calibrate(plan: Plan, seconds: float = 0.3, config_argv: list[str] | None = None) -> Calibration:
    """Measure on the devices present: the first CUDA devices if any, else this CPU. `config_argv` (the run's
    config arguments) lets the CPU runtime probe open the run's tokenizer and dataset."""
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    present = torch.cuda.device_count() if device_type == "cuda" else (os.cpu_count() or 1)
    world = max(1, min(plan.dims.world_size, present))
    threads = max(1, (os.cpu_count() or 1) // world) if world > 1 else torch.get_num_threads()
    notes = [
        f"{world} process(es) on {device_type}"
        + (f", {threads} thread(s) each" if device_type == "cpu" else "")
    ]
    if world == 1:
        cal = _measure_all(plan, torch.device(device_type), seconds)
    else:
        import torch.multiprocessing as mp

        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "calibration.pt")
            mp.spawn(
                _worker, args=(world, _free_port(), plan, device_type, seconds, threads, out), nprocs=world
            )
            cal = Calibration(**torch.load(out, weights_only=False))
    if device_type == "cpu":
        cal.tp_dispatch_s = tp_dispatch_s(plan, seconds, threads)
        if cal.tp_dispatch_s is None and plan.tp > 1 and plan.block_measurable:
            notes.append("tensor-parallel dispatch probe failed: DTensor's host time not counted")
        probe = None
        if world == plan.dims.world_size and _probe_fits(plan):
            stages = plan.pp_plan.num_stages if plan.pp_plan is not None else 1
            # the step timed again with up to PROBE_DEEPER blocks a stage (steptime.measured_step)
            deeper = min(PROBE_DEEPER, plan.args.n_layers // stages) * stages
            probe = planned_heap_probe(
                config_argv or [], threads, world, stages, deeper if deeper > stages else None
            )
        if probe is not None:
            for k, v in probe.items():
                setattr(cal, k, v)
            cal.probe_key = plan.depth_key()
        else:  # more processes than cores, or too large a plan: the runtime alone, in one process
            cal.runtime_rss_gib = runtime_rss_gib(config_argv or [], threads)
        if cal.runtime_rss_gib is None:
            notes.append(
                "runtime memory probe failed (tokenizer or dataset not readable): RSS baseline not counted"
            )
    cal.notes = notes
    return cal
