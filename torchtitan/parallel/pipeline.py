"""Pipeline parallelism with torch.distributed.pipelining: split the model into stages, build a schedule.

The model is cut by transformer layers. Stage 0 keeps `tok_embeddings`, the last stage keeps `norm` and
`output`; every stage is a deep copy of the meta-device model with the modules it does not own deleted, so
parameter names (`layers.5.attention.wq.weight`) stay those of the full model and the layout-independent
`init_weights` gives every stage exactly the values a single process would hold.

A rank may own several stages (interleaved schedules). Stage s lives on pipeline rank
  s % pp                                  "loop" placement (GPipe, 1F1B, Interleaved1F1B, InterleavedZeroBubble)
  s if s < pp else 2*pp - 1 - s           "v" placement (ZBVZeroBubble: exactly 2 stages per rank, so
                                          rank 0 holds both the first and the last stage)

Micro-batches: each rank's local batch is cut into local_batch_size / pipeline_parallel_microbatch_size
micro-batches. The schedule's loss function is the trainer's: a micro-batch's summed token cross-entropy divided
by the token count of the whole optimizer step. Gradients of the micro-batches therefore simply add up
(`scale_grads=False`), exactly as the trainer's gradient-accumulation micro-steps and FSDP's summed reduction do,
and the step's loss is the sum of the micro-batch losses.

With FSDP, `parallelize` keeps a stage's blocks gathered between forward and backward under PP ("default"
reshard policy means "never" there): resharding would all-gather every block again for every micro-batch, and
the zero-bubble schedules' split backward would lose the weight gradients of resharded blocks (it looks the
weights up through module.parameters(), which FSDP2 has swapped back to the shards), so `plan_pipeline`
rejects zero-bubble with fsdp_reshard_after_forward="always".
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from torchtitan.errors import UserError

# name in the config -> (class name in torch.distributed.pipelining, several stages per rank, placement, whether
# each backward is split into an input-gradient and a later weight-gradient pass)
SCHEDULES = {
    "GPipe": ("ScheduleGPipe", False, "loop", False),
    "1F1B": ("Schedule1F1B", False, "loop", False),
    "Interleaved1F1B": ("ScheduleInterleaved1F1B", True, "loop", False),
    "InterleavedZeroBubble": ("ScheduleInterleavedZeroBubble", True, "loop", True),
    "ZBVZeroBubble": ("ScheduleZBVZeroBubble", True, "v", True),
}

_LAYER_NAME = re.compile(r"layers\.(\d+)")


# ------------------------------------------------------------------------------------------- the plan (no torch)


@dataclass
class PipelinePlan:
    """Which layers each stage holds, which stages this layout puts on which rank, and the micro-batch count."""

    schedule: str
    pp: int
    stage_layers: list[range]  # stage index -> the layer ids it owns
    n_microbatches: int

    @property
    def num_stages(self) -> int:
        return len(self.stage_layers)

    @property
    def split_backward(self) -> bool:
        """Whether the schedule splits each backward into an input-gradient and a later weight-gradient pass."""
        return SCHEDULES[self.schedule][3]

    def stage_rank(self, stage: int) -> int:
        if SCHEDULES[self.schedule][2] == "v":
            return stage if stage < self.pp else 2 * self.pp - 1 - stage
        return stage % self.pp

    def stages_of_rank(self, pp_rank: int) -> list[int]:
        return [s for s in range(self.num_stages) if self.stage_rank(s) == pp_rank]


def even_split(n_layers: int, num_stages: int) -> list[range]:
    """Contiguous layer ranges, sizes differing by at most one; the extra layers go to the middle stages.

    The first stage also runs the embedding and the last the output head (the largest matmul for a big
    vocabulary), so when layers do not divide evenly the ends get the smaller share.
    """
    base, extra = divmod(n_layers, num_stages)
    # rank stages by distance from the ends; the `extra` most central ones get one more layer
    central = sorted(range(num_stages), key=lambda s: -min(s, num_stages - 1 - s))[:extra]
    sizes = [base + (s in central) for s in range(num_stages)]
    starts = [sum(sizes[:s]) for s in range(num_stages)]
    return [range(start, start + size) for start, size in zip(starts, sizes)]


def split_at(n_layers: int, split_points: list[str]) -> list[range]:
    """Layer ranges from split points: "layers.K" starts a new stage at layer K. Raises UserError if invalid."""
    key = "parallelism.pipeline_parallel_split_points"
    cuts = []
    for point in split_points:
        m = _LAYER_NAME.fullmatch(point)
        if m is None:
            raise UserError(f"{key}: {point!r} is not a layer name; use 'layers.K' with 1 <= K < {n_layers}")
        k = int(m.group(1))
        if not 1 <= k < n_layers:
            raise UserError(
                f"{key}: {point!r} is out of range; a split point must be layers.1 .. layers.{n_layers - 1}"
                f" (the model has {n_layers} layers)"
            )
        if cuts and k <= cuts[-1]:
            raise UserError(
                f"{key}: split points must be strictly increasing, got {point!r} after 'layers.{cuts[-1]}'"
            )
        cuts.append(k)
    bounds = [0, *cuts, n_layers]
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def plan_pipeline(
    p, n_layers: int, local_batch_size: int, tie_embeddings: bool = False, ac=None
) -> PipelinePlan:
    """Check every pipeline setting against the model and batch, before anything is allocated.

    `p` is the [parallelism] config section, `ac` the [activation_checkpoint] one (None: a forward-only use).
    Raises UserError naming the keys and values that disagree.
    """
    pp, schedule, per_rank = (
        p.pipeline_parallel_degree,
        p.pipeline_parallel_schedule,
        p.pipeline_parallel_stages_per_rank,
    )
    if schedule not in SCHEDULES:  # the config parser already restricts it; this guards direct callers
        raise UserError(
            f"parallelism.pipeline_parallel_schedule={schedule!r} is unknown; valid: {', '.join(SCHEDULES)}"
        )
    if tie_embeddings:
        raise UserError(
            "pipeline parallelism needs separate input embedding and output head, but this model flavor ties them"
            " (tie_embeddings, e.g. 1B/3B); use an untied flavor or parallelism.pipeline_parallel_degree=1"
        )
    if per_rank < 1:
        raise UserError(f"parallelism.pipeline_parallel_stages_per_rank={per_rank} must be >= 1")
    multi, split_backward = SCHEDULES[schedule][1], SCHEDULES[schedule][3]
    if not multi and per_rank != 1:
        raise UserError(
            f"parallelism.pipeline_parallel_schedule={schedule!r} runs one stage per rank, but"
            f" pipeline_parallel_stages_per_rank={per_rank}; use Interleaved1F1B, InterleavedZeroBubble or"
            " ZBVZeroBubble for several stages per rank, or set pipeline_parallel_stages_per_rank=1"
        )
    if multi and per_rank < 2:
        raise UserError(
            f"parallelism.pipeline_parallel_schedule={schedule!r} interleaves several stages per rank, but"
            f" pipeline_parallel_stages_per_rank={per_rank}; set it to 2 or more (or use GPipe / 1F1B)"
        )
    if schedule == "ZBVZeroBubble" and per_rank != 2:
        raise UserError(
            f"parallelism.pipeline_parallel_schedule='ZBVZeroBubble' needs exactly 2 stages per rank (a V),"
            f" got pipeline_parallel_stages_per_rank={per_rank}; set it to 2"
        )
    if split_backward and p.fsdp_reshard_after_forward == "always":
        # torch's split backward (stage_backward_input) looks weights up through module.parameters(), which
        # FSDP2 has swapped back to the shards after forward, so the deferred weight gradients of those blocks
        # are silently dropped (measured: the last stage's blocks got no gradient at all).
        raise UserError(
            f"parallelism.pipeline_parallel_schedule={schedule!r} loses the weight gradients of blocks that FSDP"
            " reshards after forward, but fsdp_reshard_after_forward='always'; set it to 'default' or 'never'"
        )
    if split_backward and ac is not None and ac.mode == "selective" and ac.selective_ac_option == "op":
        # torch's split backward runs a second autograd pass (the weight pass) over each stage's graph, which
        # per-op selective checkpointing refuses at the first weight pass ("Trying to backward an extra time";
        # torch 2.13, seen on a simulated ZBV rank)
        raise UserError(
            f"parallelism.pipeline_parallel_schedule={schedule!r} runs a second backward over each stage (its"
            " weight pass), which activation_checkpoint.mode='selective' with selective_ac_option='op' refuses;"
            " use mode 'full' or 'none', a block interval (selective_ac_option='2'), or 1F1B / Interleaved1F1B"
        )
    num_stages = pp * per_rank
    if p.pipeline_parallel_split_points:
        stage_layers = split_at(n_layers, p.pipeline_parallel_split_points)
        if len(stage_layers) != num_stages:
            raise UserError(
                f"parallelism.pipeline_parallel_split_points has {len(p.pipeline_parallel_split_points)} points,"
                f" giving {len(stage_layers)} stages, but pipeline_parallel_degree {pp} x"
                f" pipeline_parallel_stages_per_rank {per_rank} = {num_stages} stages; give {num_stages - 1}"
                " split points"
            )
    else:
        if n_layers < num_stages:
            raise UserError(
                f"the model has {n_layers} layers, fewer than pipeline_parallel_degree {pp} x"
                f" pipeline_parallel_stages_per_rank {per_rank} = {num_stages} stages; every stage needs a layer,"
                " so lower one of them"
            )
        stage_layers = even_split(n_layers, num_stages)

    mbs = p.pipeline_parallel_microbatch_size
    if mbs < 1 or local_batch_size % mbs:
        raise UserError(
            f"training.local_batch_size={local_batch_size} is not divisible by"
            f" parallelism.pipeline_parallel_microbatch_size={mbs}; use a micro-batch size that divides it"
        )
    n_mb = local_batch_size // mbs
    if schedule in ("GPipe", "1F1B") and n_mb < pp:
        # 1F1B needs a micro-batch per stage to fill the pipeline (torch raises otherwise); GPipe would run
        # but idle most ranks, so hold it to the same rule.
        raise UserError(
            f"{n_mb} micro-batches (training.local_batch_size={local_batch_size} /"
            f" parallelism.pipeline_parallel_microbatch_size={mbs}) is fewer than the {pp} pipeline stages;"
            f" raise local_batch_size or lower the micro-batch size so there are >= {pp}"
        )
    if multi:
        rounds = max(1, n_mb // pp)
        if (schedule == "ZBVZeroBubble" and n_mb < num_stages) or n_mb % rounds:
            need = f"a multiple of {pp}" + (f" and >= {num_stages}" if schedule == "ZBVZeroBubble" else "")
            raise UserError(
                f"{schedule} with pipeline_parallel_degree {pp} cannot run {n_mb} micro-batches"
                f" (training.local_batch_size={local_batch_size} / pipeline_parallel_microbatch_size={mbs});"
                f" the count must be {need} (or below {pp})"
            )
    return PipelinePlan(schedule=schedule, pp=pp, stage_layers=stage_layers, n_microbatches=n_mb)


# ----------------------------------------------------------------------------------------- stages and schedule


def stage_module(model: nn.Module, layers: range, first: bool, last: bool) -> nn.Module:
    """A deep copy of the (meta-device) model keeping only `layers` and, at the ends, the embedding / head.

    Deleting from the ModuleDict keeps the surviving layers' keys, hence their FQNs and init values.
    """
    stage = copy.deepcopy(model)
    for key in list(stage.layers.keys()):
        if int(key) not in layers:
            del stage.layers[key]
    if not first:
        stage.tok_embeddings = None
    if not last:
        stage.norm = None
        stage.output = None
    return stage


def build_pipeline(
    model: nn.Module,
    plan: PipelinePlan,
    pp_mesh,
    device: torch.device,
    parallelize_stage: Callable[[nn.Module], nn.Module],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    make_stage: Callable | None = None,
):
    """Build this rank's stages (each parallelized by `parallelize_stage`, still on meta) and the schedule.

    Returns (schedule, model_parts, has_first_stage, has_last_stage). The caller materializes and initializes
    `model_parts` afterwards; the stages and schedule only hold references to them. `make_stage(part, stage,
    num_stages, device, group)` replaces torch's PipelineStage (the fake-backend simulation gives shapes).
    """
    from torch.distributed import pipelining

    pp_rank = pp_mesh.get_local_rank()
    stage_ids = plan.stages_of_rank(pp_rank)
    parts, stages = [], []
    for s in stage_ids:
        part = stage_module(model, plan.stage_layers[s], first=s == 0, last=s == plan.num_stages - 1)
        part = parallelize_stage(part)
        parts.append(part)
        if make_stage is None:
            stages.append(
                pipelining.PipelineStage(part, s, plan.num_stages, device, group=pp_mesh.get_group())
            )
        else:
            stages.append(make_stage(part, s, plan.num_stages, device, pp_mesh.get_group()))
    cls_name, multi, _, _ = SCHEDULES[plan.schedule]
    cls = getattr(pipelining, cls_name)
    schedule = cls(
        stages if multi else stages[0],
        n_microbatches=plan.n_microbatches,
        loss_fn=loss_fn,
        scale_grads=False,  # each micro-batch loss is already divided by the step's token count: grads add up
    )
    return schedule, parts, 0 in stage_ids, plan.num_stages - 1 in stage_ids


def _step_accepts_return_outputs(schedule) -> bool:
    return "return_outputs" in inspect.signature(schedule.step).parameters


def pipeline_forward_backward(
    schedule, inputs: torch.Tensor, labels: torch.Tensor, has_first: bool, has_last: bool, loss_context=None
) -> torch.Tensor:
    """One pipelined forward+backward over the local batch; returns the summed micro-batch losses (0 off the
    last stage).

    Ranks without the last stage return a zero so that a SUM over the pp mesh yields the loss on every rank
    (the metrics processor does that reduction on log steps only). `loss_context` is loss_parallel() under TP.
    """
    losses: list[torch.Tensor] | None = [] if has_last else None
    kwargs = {"target": labels if has_last else None, "losses": losses}
    if _step_accepts_return_outputs(schedule):  # newer torch: do not keep the merged full-batch logits
        kwargs["return_outputs"] = False
    with loss_context() if loss_context is not None else contextlib.nullcontext():
        schedule.step(*((inputs,) if has_first else ()), **kwargs)
    if has_last:
        losses = [loss.detach() for loss in losses]
        losses = [loss.full_tensor() if isinstance(loss, DTensor) else loss for loss in losses]
        return torch.stack([loss.float() for loss in losses]).sum()
    return torch.zeros((), device=inputs.device)
