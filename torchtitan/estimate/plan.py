"""Everything an estimate needs, resolved once from the config: model, layout, hardware, flags.

The layout checks are the trainer's own (ParallelDims.validate, plan_pipeline), so the estimator accepts exactly
the configurations training accepts. The model's linear layers come from the model itself, built on the meta
device, and float8's share from the float8 module filter: no second description of the architecture.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field

from torchtitan.errors import UserError
from torchtitan.metrics.hardware import DeviceSpec, device_spec, stated_memory_gb
from torchtitan.models import model_args_from_config
from torchtitan.models.llama3 import ModelArgs
from torchtitan.parallel.compile import compiles_loss
from torchtitan.parallel.dims import ParallelDims
from torchtitan.parallel.pipeline import PipelinePlan, plan_pipeline

from . import rates
from .activations import BlockShape
from .efficiency import DEFAULT, Efficiency

GIB = 2**30


@dataclass(frozen=True)
class Hardware:
    """A device with every number the estimator uses filled in (table, overrides, or measurement)."""

    name: str
    bf16_tflops: float
    fp8_tflops: float | None
    memory_gib: float
    hbm_gbps: float
    intra_node_gbps: float
    inter_node_gbps: float
    devices_per_node: int
    is_cpu: bool = False
    inter_node_busbw_gbps: float | None = None  # measured across the job's nodes (replaces the rail model)
    source: str = "table"
    power_limit_w: float | None = (
        None  # run below the part's TDP (torchtitan/estimate/rates.py: power factor)
    )
    sm_clock_mhz: float | None = None  # SM clock locked below boost (rates.compute_factor)


@dataclass(frozen=True)
class Linear:
    name: str  # e.g. "wq", "output"
    in_features: int
    out_features: int
    float8: bool  # converted by the float8 module filter (when float8 is enabled)
    colwise: bool  # tensor parallel splits the output features (else the input features)


@dataclass
class Calibration:
    """Measured on the devices present (calibrate.py); each field replaces a table value or efficiency."""

    device: str = ""
    matmul_tflops: dict = field(default_factory=dict)  # (M, N, K) -> sustained TFLOPS of that bf16 GEMM
    matmul_peak_tflops: float | None = None  # square-GEMM peak (the MFU reference on CPU)
    attention_tflops: float | None = None  # SDPA forward+backward on the FLOPs it does
    hbm_gbps: float | None = None  # elementwise copy bandwidth actually sustained
    # inference: the bf16 weight-read rate of one decode step's own matmuls (every linear of a block, tensor-parallel
    # share, and the head, at the planned batch), bytes of weights over their measured time
    decode_gbps: float | None = None
    # inference: this trainer's own decode step and prefill (torchtitan.generate) timed on the device with the planned
    # batch, weights, prompt and context at two depths, [[n_layers, seconds], ...] (calibrate.measure_generation)
    decode_step_s: list = field(default_factory=list)
    prefill_s: list = field(default_factory=list)
    collective_gbps: float | None = None  # all-gather / reduce-scatter bus bandwidth between the processes
    # CPU: [kind, processes, bytes, seconds] of each collective alone at two sizes (collectives.ring_time)
    collective_s: list = field(default_factory=list)
    runtime_rss_gib: float | None = None  # CPU: resident memory of the trainer's runtime, before any model
    # CPU, measured by the probe in the planned world (calibrate.planned_heap_probe): its steps' tensor peak above
    # the runtime, and what glibc's heap kept resident at that peak beyond it
    probe_tensors_gib: float | None = None
    heap_retention_gib: float | None = None
    # CPU: the trainer's step time in the planned world at two depths, [[n_layers, seconds], ...], and the plan it
    # ran (Plan.depth_key): calibrate.planned_heap_probe, steptime.measured_step
    probe_step_s: list = field(default_factory=list)
    probe_key: str | None = None
    # CPU: rank 0's peak resident memory of the same runs' steps, [[n_layers, GiB], ...] (memory.measured_rss)
    probe_rss_gib: list = field(default_factory=list)
    # the trainer's eager cross-entropy (fp32 upcast), forward + backward, per logit
    loss_ns_per_logit: float | None = None
    # an eager block's forward + backward as the trainer runs it, its GEMMs and attention alone, its tokens
    # (calibrate.measure_block)
    block_s: float | None = None
    block_kernels_s: float | None = None
    block_tokens: int | None = None
    # the same for the final norm, output projection and loss (calibrate.measure_head), over block_tokens tokens
    head_s: float | None = None
    head_kernels_s: float | None = None
    # CPU, tensor parallel: a TP block's forward + backward beyond the plain block's (calibrate.measure_tp_dispatch)
    tp_dispatch_s: float | None = None
    notes: list = field(default_factory=list)


def _pick(override, value, what: str):
    if override is not None:
        if not (isinstance(override, (int, float)) and math.isfinite(override) and override > 0):
            raise UserError(f"estimate.{what} = {override!r} must be a positive number")
        return override
    return value


def _sm_clock(device: str, clock) -> float | None:
    """--estimate.sm_clock_mhz, checked: a positive clock no higher than the boost of a part whose burst and
    sustained rates are both known (rates.LOCKABLE_CLOCK)."""
    clock = _pick(clock, None, "sm_clock_mhz")
    if clock is None:
        return None
    if device not in rates.LOCKABLE_CLOCK:
        parts = ", ".join(f"{k} (boost {v[0]:.0f})" for k, v in rates.LOCKABLE_CLOCK.items())
        raise UserError(f"estimate.sm_clock_mhz: a locked clock is priced only on {parts}, not on {device}")
    boost = rates.LOCKABLE_CLOCK[device][0]
    if clock > boost:
        raise UserError(
            f"estimate.sm_clock_mhz = {clock:g} is above the {device}'s boost clock ({boost:.0f} MHz)"
        )
    return float(clock)


def along_depths(points: list, pick, n: int) -> float | None:
    """A figure measured on a model cut to fewer blocks (`points`: [[n_layers, value], ...], a depth possibly
    measured more than once, its values reduced by `pick`) carried along the line through the shallowest and the
    deepest depth to `n` blocks; with one depth, its value only if that depth is `n`. A step cannot take less time
    or memory with more blocks: a pair that falls with depth is noise, and the line that fits it best without a
    negative slope is flat at the pair's mean."""
    if not points:
        return None
    runs: dict[int, list[float]] = {}
    for depth, value in points:
        runs.setdefault(depth, []).append(value)
    at = sorted((depth, pick(values)) for depth, values in runs.items())
    if len(at) < 2:
        return at[0][1] if at[0][0] == n else None
    (d1, v1), (d2, v2) = at[0], at[-1]
    if v2 < v1:
        return (v1 + v2) / 2
    return v1 + (v2 - v1) / (d2 - d1) * (n - d1)


def resolve_hardware(
    est, calibration: Calibration | None = None, require_rates: bool = True, collectives: bool = True
) -> Hardware:
    """The [estimate] hardware with its overrides applied; CPU numbers must come from a calibration.

    require_rates=False leaves unknown rates as NaN (enough for memory, and for planning the calibration);
    collectives=False: the plan prices no collective by bandwidth (generation: inference.inference_hardware)."""
    spec: DeviceSpec = device_spec(est.hardware)
    stated = stated_memory_gb(est.hardware)
    if (
        stated
        and abs(stated / spec.memory_gib - 1) > 0.05
        and None in (est.memory_gib, est.hbm_bandwidth_gbps)
    ):
        # the same peak for MFU (Leonardo's "NVIDIA A100-SXM-64GB"), but not the table's memory and bandwidth
        raise UserError(
            f"estimate.hardware={est.hardware!r} states {stated} GB, the table's {spec.name} has"
            f" {spec.memory_gib:g} GB: plan it with --estimate.memory_gib=<the GiB torch reports> and"
            " --estimate.hbm_bandwidth_gbps=<its memory bandwidth>"
        )
    cal = calibration or Calibration()
    is_cpu = spec.name == "CPU"
    bf16 = _pick(est.peak_tflops, spec.bf16_tflops, "peak_tflops")
    if bf16 is None:
        bf16 = cal.matmul_peak_tflops
    fp8 = est.fp8_peak_tflops
    if fp8 is None and spec.fp8_tflops is not None:
        fp8 = spec.fp8_tflops if est.peak_tflops is None else spec.fp8_tflops / spec.bf16_tflops * bf16
    memory = _pick(est.memory_gib, spec.memory_gib, "memory_gib")
    if memory is None:  # CPU: the machine's RAM
        from torchtitan.metrics.memory import device_memory_gib

        memory = device_memory_gib("cpu")
    hbm = _pick(est.hbm_bandwidth_gbps, spec.hbm_gbps, "hbm_bandwidth_gbps") or cal.hbm_gbps
    intra = _pick(est.intra_node_bandwidth_gbps, spec.intra_node_gbps, "intra_node_bandwidth_gbps")
    intra = intra or cal.collective_gbps
    inter = _pick(est.inter_node_bandwidth_gbps, spec.inter_node_gbps, "inter_node_bandwidth_gbps") or intra
    per_node = est.devices_per_node or spec.devices_per_node
    if is_cpu and est.devices_per_node is None:
        per_node = max(est.num_devices, 1)  # CPU processes of one host talk over loopback
    needed = [("peak", bf16), ("memory bandwidth", hbm)]
    if est.num_devices > 1 and collectives:
        needed.append(("collective bandwidth", intra))
    missing = [n for n, v in needed if not v]
    if missing and require_rates:
        raise UserError(
            f"estimate.hardware={est.hardware!r}: {', '.join(missing)} unknown; run with --estimate.calibrate=true"
            " (measures this machine) or set --estimate.peak_tflops / hbm_bandwidth_gbps / intra_node_bandwidth_gbps"
        )
    overridden = [
        k
        for k in (
            "peak_tflops",
            "fp8_peak_tflops",
            "memory_gib",
            "hbm_bandwidth_gbps",
            "intra_node_bandwidth_gbps",
            "inter_node_bandwidth_gbps",
            "inter_node_busbw_gbps",
            "power_limit_w",
            "sm_clock_mhz",
        )
        if getattr(est, k, None) is not None
    ]
    source = "measured" if is_cpu else "table"
    if overridden:
        source += " + overrides (" + ", ".join(overridden) + ")"
    nan = float("nan")
    return Hardware(
        name=spec.name,
        bf16_tflops=float(bf16 or nan),
        fp8_tflops=fp8,
        memory_gib=float(memory),
        hbm_gbps=float(hbm or nan),
        intra_node_gbps=float(intra or nan),
        inter_node_gbps=float(inter or nan),
        devices_per_node=int(per_node),
        is_cpu=is_cpu,
        source=source,
        inter_node_busbw_gbps=_pick(est.inter_node_busbw_gbps, None, "inter_node_busbw_gbps"),
        power_limit_w=_pick(getattr(est, "power_limit_w", None), None, "power_limit_w"),
        sm_clock_mhz=_sm_clock(spec.name, getattr(est, "sm_clock_mhz", None)),
    )


_LINEARS: dict[tuple[str, int], tuple[tuple[Linear, ...], Linear]] = {}


def model_linears(args: ModelArgs, min_dim: int) -> tuple[tuple[Linear, ...], Linear]:
    """(one block's linears, the output head) of the model built on the meta device, with float8 decisions."""
    key = (repr(args), min_dim)
    if key not in _LINEARS:
        _LINEARS[key] = _build_linears(args, min_dim)
    return _LINEARS[key]


def _build_linears(args: ModelArgs, min_dim: int) -> tuple[tuple[Linear, ...], Linear]:
    import torch

    from torchtitan.models.llama3 import Transformer
    from torchtitan.quantize.float8 import filter_decision

    small = dataclasses.replace(args, n_layers=1, max_seq_len=2)  # one block is all we need; tiny RoPE table
    with torch.device("meta"):
        model = Transformer(small)
    block, head = [], None
    for fqn, m in model.named_modules():
        if not isinstance(m, torch.nn.Linear):
            continue
        name = fqn.rsplit(".", 1)[-1]
        fp8 = filter_decision(fqn, m.in_features, m.out_features, min_dim) is None
        lin = Linear(name, m.in_features, m.out_features, fp8, colwise=name not in ("wo", "w2"))
        if fqn == "output":
            head = lin
        else:
            block.append(lin)
    if (
        head is None
    ):  # tied embeddings: the output matmul uses the embedding table (never float8: it is the head)
        head = Linear("output", args.dim, args.vocab_size, False, colwise=True)
    return tuple(block), head


@dataclass
class Plan:
    """A resolved training configuration, per rank (the numbers every formula reads)."""

    cfg: object
    args: ModelArgs
    dims: ParallelDims
    pp_plan: PipelinePlan | None
    hw: Hardware
    eff: Efficiency
    calibration: Calibration | None
    block_linears: tuple[Linear, ...]
    head: Linear

    # ---- convenience views of the config ----
    @property
    def seq_len(self) -> int:
        return self.cfg.training.seq_len

    @property
    def local_batch(self) -> int:
        return self.cfg.training.local_batch_size

    @property
    def accum(self) -> int:
        return self.dims.grad_accumulation_steps(self.cfg.training)

    @property
    def reduce_rounds(self) -> int:
        """Gradient reductions (FSDP's reduce-scatters, the replicas' all-reduce) per optimizer step: one per
        micro-step (this trainer; under PP, one per schedule step), or one after the last micro-step under no_sync
        (`--estimate.dp_grad_sync=step`: DDP's no_sync, FSDP2's set_requires_gradient_sync(False), FSDP1's no_sync)."""
        return 1 if self.cfg.estimate.dp_grad_sync == "step" else self.accum

    @property
    def unsharded_grad_passes(self) -> int:
        """Forward+backward passes whose gradients FSDP accumulates unsharded, in the reduce dtype, before one
        reduce-scatter (torch/distributed/fsdp/_fully_shard/_fsdp_param.py: to_accumulated_grad_if_needed,
        accumulate_unsharded_grad_if_needed): a schedule step's micro-batches under PP, the micro-steps under
        no_sync; 1 when each pass is reduced on its own, and without FSDP's sharding."""
        if self.fsdp_degree == 1 or not self.fsdp_wrapped:
            return 1
        return self.n_microbatches * self.accum // self.reduce_rounds

    @property
    def tp(self) -> int:
        return self.dims.tp

    @property
    def cp(self) -> int:
        return self.dims.cp

    @property
    def pp(self) -> int:
        return self.dims.pp

    @property
    def fsdp_degree(self) -> int:
        return self.dims.dp_shard * self.dims.cp

    @property
    def split_backward(self) -> bool:
        """Whether a pipeline schedule splits each backward into input- and weight-gradient passes (zero-bubble)."""
        return self.pp_plan is not None and self.pp_plan.split_backward

    def whole_backward_blocks(self, has_emb: bool) -> int:
        """Blocks of a pipeline rank whose backward runs whole under a split-backward schedule: the first stage's,
        on the rank that holds it (torch 2.13 skips the first stage's input-gradient pass and runs its backward in
        the weight pass, stage.py `backward_one_chunk`); none elsewhere."""
        return len(self.pp_plan.stage_layers[0]) if has_emb else 0

    @property
    def compile_model(self) -> bool:
        c = self.cfg.compile
        return c.enable and "model" in c.components

    @property
    def compile_loss(self) -> bool:
        return compiles_loss(self.cfg, "cpu" if self.hw.is_cpu else "cuda")  # the trainer's rule

    @property
    def block_measurable(self) -> bool:
        """Whether a calibration times the planned block in place (calibrate.measure_block): eager runs without
        float8. A compiled block's fused elementwise work and float8's casts are priced by their own rules."""
        return not self.compile_model and not self.float8

    @property
    def head_measurable(self) -> bool:
        """Whether a calibration times the planned head in place (calibrate.measure_head): an eager block and
        loss without tensor parallelism (whose head gathers or shards the logits: priced apart)."""
        return self.block_measurable and not self.compile_loss and self.tp == 1

    @property
    def float8(self) -> bool:
        return self.cfg.float8.enable

    @property
    def float8_all_gather(self) -> bool:
        return self.float8 and self.cfg.float8.enable_fsdp_float8_all_gather

    @property
    def sequence_parallel(self) -> bool:
        return self.tp > 1 and self.cfg.parallelism.enable_sequence_parallel

    @property
    def loss_parallel(self) -> bool:
        """The loss over vocabulary shards: needs the output projection split over the TP ranks (a replicated head,
        --estimate.tp_head=replicated, holds the whole logits)."""
        return self.cfg.parallelism.enable_loss_parallel and self.head_tp_shards > 1

    @property
    def loss_vocab(self) -> float:
        """Vocabulary entries of the logits a rank holds and takes the loss of: its shard under loss parallel,
        the whole vocabulary otherwise (without TP, or TP with the output layout Replicate)."""
        return self.args.vocab_size / self.tp if self.loss_parallel else self.args.vocab_size

    @property
    def bf16_model(self) -> bool:
        """Parameters, gradients and optimizer states kept in bf16, no fp32 copy (--estimate.model_dtype)."""
        return self.cfg.estimate.model_dtype == "bfloat16"

    @property
    def param_bytes(self) -> int:
        """Bytes of a parameter as the optimizer holds it, and of its gradient: fp32 master weights, or bf16."""
        return 2 if self.bf16_model else 4

    @property
    def act_bytes(self) -> int:
        return 2 if self.bf16_model or self.cfg.training.mixed_precision_param == "bfloat16" else 4

    @property
    def fsdp_wrapped(self) -> bool:
        """FSDP2 is applied: the trainer's rule (torchtitan/parallel/__init__.py), dims.fsdp_enabled or CPU offload."""
        return self.dims.fsdp_enabled or self.cfg.parallelism.fsdp_cpu_offload

    @property
    def autocast(self) -> bool:
        """Mixed precision by torch.autocast rather than FSDP2: without an FSDP wrapper a bf16 run keeps fp32
        parameters and autocasts its matmuls (parallel/mixed_precision.py)."""
        return not self.fsdp_wrapped and self.act_bytes == 2 and not self.bf16_model

    def float8_input_groups(self) -> tuple[frozenset, frozenset]:
        """Compiled float8 blocks: the matmul-input groups all of whose linears are converted
        (BlockShape.f8_inputs) and those with some but not all (BlockShape.f8_partial)."""
        if not (self.float8 and self.compile_model):
            return frozenset(), frozenset()
        conv = {lin.name: lin.float8 for lin in self.block_linears}
        groups = {"attn": ("wq", "wk", "wv"), "wo": ("wo",), "ffn": ("w1", "w3"), "w2": ("w2",)}
        converted = {g: sum(conv.get(x, False) for x in names) for g, names in groups.items()}
        every = frozenset(g for g, names in groups.items() if converted[g] == len(names))
        some = frozenset(g for g in groups if converted[g]) - every
        return every, some

    @property
    def stream_bytes(self) -> int:
        """Bytes of a residual-stream element: fp32 under autocast (the embedding's fp32 output plus the blocks'
        bf16 outputs promote to fp32), else the activation dtype FSDP's mixed precision gives every block."""
        return 4 if self.autocast else self.act_bytes

    @property
    def reduce_bytes(self) -> int:
        return 4 if self.cfg.training.mixed_precision_reduce == "float32" else 2

    @property
    def async_tp(self) -> bool:
        return self.cfg.estimate.async_tp

    @property
    def shape(self) -> BlockShape:
        a, t = self.args, self.tp
        f8_every, f8_some = self.float8_input_groups()
        return BlockShape(
            d=a.dim,
            h=a.n_heads * a.head_dim // t,
            kv=a.n_kv_heads * a.head_dim // t,
            f=a.ffn_hidden_dim // t,
            heads=a.n_heads // t,
            tp=t,
            sequence_parallel=self.sequence_parallel,
            act_bytes=self.act_bytes,
            stream_bytes=self.stream_bytes,
            f8_inputs=f8_every,
            f8_partial=f8_some,
            fused_norm=not self.hw.is_cpu and self.cfg.estimate.eager_rms_norm == "fused",
            op_saves_attention=self.cfg.estimate.sac_saves_attention,
            recompute_stops_early=self.compile_model or self.cfg.estimate.ac_early_stop,
        )

    @property
    def microbatch_seqs(self) -> int:
        """Sequences per forward pass of a stage: the pipeline micro-batch, or the whole local batch."""
        if self.pp_plan is not None:
            return self.cfg.parallelism.pipeline_parallel_microbatch_size
        return self.local_batch

    @property
    def n_microbatches(self) -> int:
        return self.pp_plan.n_microbatches if self.pp_plan is not None else 1

    @property
    def tokens_per_pass(self) -> float:
        """Tokens one forward pass of a stage holds on this rank (CP splits the sequence)."""
        return self.microbatch_seqs * self.seq_len / self.cp

    def rank_layers(self) -> list[tuple[int, bool, bool]]:
        """Per pipeline rank: (blocks, holds the embedding, holds the head). One entry without PP."""
        if self.pp_plan is None:
            return [(self.args.n_layers, True, True)]
        out = []
        last = self.pp_plan.num_stages - 1
        for r in range(self.pp):
            stages = self.pp_plan.stages_of_rank(r)
            n = sum(len(self.pp_plan.stage_layers[s]) for s in stages)
            out.append((n, 0 in stages, last in stages))
        return out

    def depth_key(self) -> str:
        """What the trainer's steps measured at another depth must share with this plan to stand for it
        (steptime.measured_step), as a short hash: the settings that shape a step -- the model's shape but its
        number of blocks, the world, batch and precision, parallelism, activation checkpointing, compile, float8
        and the optimizer's implementation."""
        c = self.cfg
        training = (
            "local_batch_size",
            "global_batch_size",
            "seq_len",
            "mixed_precision_param",
            "mixed_precision_reduce",
            "cpu_bf16_fp32_kernels",
        )
        what = [
            {k: v for k, v in dataclasses.asdict(self.args).items() if k != "n_layers"},
            self.dims.world_size,
            {k: getattr(c.training, k) for k in training},
            *(dataclasses.asdict(x) for x in (c.parallelism, c.activation_checkpoint, c.compile, c.float8)),
            c.optimizer.implementation,
        ]
        return hashlib.sha1(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:12]

    def along_probed_depths(self, points: list, pick) -> float | None:
        """A figure of the trainer's own steps that a CPU calibration measured on this plan cut to fewer blocks
        (`points`: [[n_layers, value], ...], a depth possibly timed more than once, its runs reduced by `pick`),
        carried along the line through the shallowest and the deepest depth to this plan's number of blocks. A
        stage runs its blocks one after the other and holds each block's weights, states and saved activations,
        while everything else in a step (embedding, head, loss, optimizer's host time, runtime) is the same at
        every depth: time and resident memory are linear in the blocks (never falling: along_depths). None
        on GPUs, without a calibration of this very plan (`depth_key`: a search's other layouts), or with one depth
        only unless it is the plan's own."""
        cal = self.calibration
        if cal is None or not self.hw.is_cpu or not points or cal.probe_key != self.depth_key():
            return None
        return along_depths(points, pick, self.args.n_layers)

    def block_params(self) -> float:
        """Parameters of one block on this rank (TP-sharded matrices; norms replicated)."""
        mats = sum(lin.in_features * lin.out_features for lin in self.block_linears)
        return mats / self.tp + 2 * self.args.dim

    @property
    def embedding_tp_shards(self) -> int:
        """TP ranks the token embedding's rows are split over: all of them (this trainer, rowwise), or 1 where every
        TP rank keeps the whole table (--estimate.tp_embedding=replicated)."""
        return self.tp if self.cfg.estimate.tp_embedding == "sharded" else 1

    def embedding_params(self) -> float:
        """The token embedding's parameters on this rank."""
        return self.args.vocab_size * self.args.dim / self.embedding_tp_shards

    def embedding_grad_params(self) -> float:
        """Elements of the token embedding's weight gradient on this rank: the whole table where TP splits its rows,
        since DTensor makes that gradient Partial (a whole-table sum of the rank's own tokens; see
        memory.embedding_backward_bytes) until it is reduce-scattered to the rank's rows, else its parameters."""
        if self.embedding_tp_shards == 1:
            return self.embedding_params()
        return self.args.vocab_size * self.args.dim

    @property
    def head_tp_shards(self) -> int:
        """TP ranks the output projection is split over: all of them (this trainer, column-wise), or 1 where every
        TP rank runs the whole projection (--estimate.tp_head=replicated)."""
        return self.tp if self.cfg.estimate.tp_head == "sharded" else 1

    def tp_shards(self, lin) -> int:
        """TP ranks a linear of the model (a block's, or the head) is split over."""
        return self.head_tp_shards if lin is self.head else self.tp

    def head_params(self) -> float:
        """norm + output (0 for the output when tied: it is the embedding's table)."""
        out = 0 if self.args.tie_embeddings else self.args.vocab_size * self.args.dim / self.head_tp_shards
        return out + self.args.dim


def build_plan(
    cfg, calibration: Calibration | None = None, eff: Efficiency = DEFAULT, require_rates: bool = True
) -> Plan:
    """Resolve and check a training configuration for `cfg.estimate.num_devices` devices."""
    est = cfg.estimate
    if est.num_devices < 1:
        raise UserError(f"estimate.num_devices = {est.num_devices} must be >= 1")
    if est.devices_per_node is not None and est.devices_per_node < 1:
        raise UserError(f"estimate.devices_per_node = {est.devices_per_node} must be >= 1 or none")
    if not 0 < est.goodput_percent <= 100:
        raise UserError(f"estimate.goodput_percent = {est.goodput_percent} must be in (0, 100]")
    hw = resolve_hardware(est, calibration, require_rates)
    args = model_args_from_config(cfg.model, cfg.training.seq_len)
    dims = ParallelDims.from_config(cfg.parallelism, est.num_devices)
    dims.validate(args, cfg, "cpu" if hw.is_cpu else "cuda")
    if est.dp_grad_sync == "step" and dims.pp_enabled:
        raise UserError(
            "estimate.dp_grad_sync = 'step' prices no_sync over gradient-accumulation micro-steps; under pipeline"
            " parallelism the schedule already reduces once per step: set pipeline_parallel_degree=1 or"
            " dp_grad_sync=micro_step"
        )
    pp_plan = None
    if dims.pp_enabled:
        pp_plan = plan_pipeline(
            cfg.parallelism,
            args.n_layers,
            cfg.training.local_batch_size,
            args.tie_embeddings,
            cfg.activation_checkpoint,
        )
    block, head = model_linears(args, cfg.float8.min_dim)
    if not cfg.float8.enable:
        block = tuple(dataclasses.replace(lin, float8=False) for lin in block)
        head = dataclasses.replace(head, float8=False)
    plan = Plan(cfg, args, dims, pp_plan, hw, eff, calibration, block, head)
    if plan.bf16_model and cfg.parallelism.fsdp_cpu_offload:
        raise UserError(
            "estimate.model_dtype = 'bfloat16' is not priced with parallelism.fsdp_cpu_offload (the offloaded"
            " states are this trainer's fp32 ones); valid here: trainer"
        )
    return plan
