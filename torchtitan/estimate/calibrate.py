"""`--estimate.calibrate`: micro-benchmarks on the devices present, replacing table values and efficiencies.

Measured, each for a fraction of a second:
  matmul        every GEMM shape the planned step runs (forward, input-gradient, weight-gradient of each linear,
                rows capped), in the run's compute dtype, and the square-GEMM peak the trainer's MFU uses on
                devices without a table entry (hardware.calibrate_tflops: the same measurement)
  attention     SDPA forward + backward at the planned head count, sequence length and head dim (causal)
  bandwidth     an elementwise add over tensors far larger than the caches: sustained memory bandwidth
  loss          the trainer's eager cross-entropy (fp32 upcast, log-softmax, NLL) forward + backward at the planned
                vocabulary and tokens: nanoseconds per logit
  collectives   all-gather and reduce-scatter between min(num_devices, present) processes (NCCL on GPUs, gloo on
                CPU), at the size of one block's parameters: bus bandwidth
  runtime RSS   CPU only: resident memory of the trainer's runtime without a model -- the trainer's build for the
                config (imports, tokenizer, dataset, process group, metrics) and a few steps, less the model's own
                weights, gradients and AdamW moments -- measured in the planned world and layout on the planned
                model cut to one block per pipeline stage, with every tensor its own mapping; the same probe with
                glibc's defaults gives what the heap keeps at a step's peak (heap retention). Where the planned
                world does not fit this machine: the runtime alone, one process, a one-block width-64 model
With several processes every micro-benchmark runs in all of them at once (rank 0 reports), so cores, memory
bandwidth and links are shared as they will be in the run. CPU processes get the threads the launcher gives them
(torchrun: 1 thread each when there are several).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time

import torch

from .plan import Calibration, Plan

_ROWS_CAP = {"cuda": 16384, "cpu": 4096}
_SEQ_CAP = {"cuda": 8192, "cpu": 2048}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_time(fn, device: torch.device, seconds: float, min_reps: int = 3) -> float:
    """Median of repeated calls (after one warm-up) within about `seconds`: the sustained rate, not the best
    moment (with several processes, the best moment is when the others happened to idle)."""
    import torch.distributed as dist

    fn()
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    # How many calls fit in `seconds`. Every process must make the same number: fn may be a collective, and a
    # process that stopped on its own clock would leave the others waiting in one (or tear down under them).
    reps = torch.tensor([max(min_reps, int(seconds / max(time.perf_counter() - t0, 1e-9)))], device=device)
    if dist.is_initialized():
        dist.all_reduce(reps, op=dist.ReduceOp.MAX)
        dist.barrier()  # every process measures at the same time, sharing cores and memory as in the run
    times = []
    for _ in range(int(reps)):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


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
_RUNTIME_PROBE = """
import os, sys
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
for _ in range(int(os.environ["PROBE_STEPS"])):
    run.optimizer.zero_grad(set_to_none=True)
    for _ in range(run.accum_steps):
        inputs, labels = next(data)
        forward_backward(run.model_parts, inputs, labels, run.global_tokens, run.loss_context, run.pp, run.loss_fn)
    reduce_partial_grads(run.model_parts)
    clip_grad_norm_([p for part in run.model_parts for p in part.parameters()], cfg.training.max_norm,
                    pp_mesh=run.dims.mesh("pp") if run.dims.pp_enabled else None)
    run.optimizer.step()
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
    print(rss - own, max(hwm, rss))
"""


def _run_probe(
    argv: list[str], threads: int | None, world: int = 1, form: str = "tiny", mmapped: bool = False
) -> tuple[float, float] | None:
    """Run the probe (`form`: "tiny" or "planned", its `argv` already shaped) in `world` processes; rank 0's
    (runtime GiB, peak GiB of the steps), or None when it fails. `mmapped`: every tensor of 128 KiB or more its
    own mapping (glibc's MALLOC_MMAP_THRESHOLD_), returned to the system when freed."""
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
    runtime, peak = (int(x) for x in out.strip().splitlines()[-1].split())
    return runtime / 2**30, peak / 2**30


def runtime_rss_gib(argv: list[str], threads: int | None = None) -> float | None:
    """Resident memory of a fresh process holding the trainer's runtime but (almost) no model: the trainer's build
    for the config (imports, tokenizer, dataset, process group, metrics) and two steps of a one-block width-64
    model, which page in the kernels a step runs, less that model's own tensors -- the CPU baseline under a run's
    own tensors. `threads`: the run's threads per process (per-thread kernel buffers), default the caller's."""
    r = _run_probe([*argv, *_TINY], threads)
    return None if r is None else r[0]


def planned_heap_probe(argv: list[str], threads: int | None, world: int, blocks: int) -> dict | None:
    """The probe on the planned model, world and layout with `blocks` transformer blocks (one per pipeline stage),
    twice: with every tensor its own mapping (the runtime in the planned world, and the steps' tensor peak above
    it) and with glibc's defaults (the same peak plus what the heap keeps: freed blocks that later requests do not
    fit, which stay resident). GiB; None when either run fails."""
    shaped = [*argv, f"--model.n_layers={blocks}"]
    mapped = _run_probe(shaped, threads, world, "planned", mmapped=True)
    heap = _run_probe(shaped, threads, world, "planned") if mapped else None
    if heap is None:
        return None
    runtime, peak = mapped
    return {
        "runtime_rss_gib": runtime,
        "probe_tensors_gib": peak - runtime,
        "heap_retention_gib": max(0.0, heap[1] - peak),
    }


def _measure_all(plan: Plan, device: torch.device, seconds: float) -> Calibration:
    from torchtitan.metrics.hardware import calibrate_tflops
    from torchtitan.parallel.cpu_bf16 import matmul_dtype

    # the kernels such a run uses (fp32 for bf16 on a CPU without bf16 instructions: parallel/cpu_bf16.py)
    act_dtype = torch.bfloat16 if plan.act_bytes == 2 else torch.float32  # the logits the loss reads
    dtype = matmul_dtype(device.type, act_dtype, plan.cfg.training.cpu_bf16_fp32_kernels)
    cal = Calibration(device=str(device))
    cal.matmul_peak_tflops = calibrate_tflops(device, dtype, seconds=seconds)
    for shape in gemm_shapes(plan):
        cal.matmul_tflops[shape] = measure_gemm(shape, device, dtype, seconds / 4)
    cal.attention_tflops = measure_attention(plan, device, dtype, seconds)
    cal.hbm_gbps = measure_bandwidth(device, dtype, seconds)
    cal.loss_ns_per_logit = measure_loss(plan, device, act_dtype, seconds)
    cal.collective_gbps = measure_collectives(plan, device, seconds)
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
        probe = None
        if world == plan.dims.world_size and _probe_fits(plan):
            blocks = plan.pp_plan.num_stages if plan.pp_plan is not None else 1
            probe = planned_heap_probe(config_argv or [], threads, world, blocks)
        if probe is not None:
            for k, v in probe.items():
                setattr(cal, k, v)
        else:  # more processes than cores, or too large a plan: the runtime alone, in one process
            cal.runtime_rss_gib = runtime_rss_gib(config_argv or [], threads)
        if cal.runtime_rss_gib is None:
            notes.append(
                "runtime memory probe failed (tokenizer or dataset not readable): RSS baseline not counted"
            )
    cal.notes = notes
    return cal
