"""Loss and perplexity on held-out data, in any parallel layout, without touching the training state.

The validation set is a fixed list of `validation.steps` global batches of G sequences (G =
validation.global_batch_size, default the training global batch): the first steps x G packed windows of the
held-out split, read in order from one stream (no dp sharding of the source), so the set of sequences does not
depend on the layout. Data-parallel rank r evaluates rows [r * G/dp, (r + 1) * G/dp) of each global batch, in
micro-batches of training.local_batch_size (the shape the model, and a pipeline schedule, already run). The
batches are read once, when the Evaluator is built (before training: a missing or too short split fails at the
start), and kept: every evaluation sees the same tokens.

Each rank adds up the token cross-entropy (fp32, as in training) of what it computes: under tensor parallel the
loss (vocabulary-parallel with loss_parallel) is the whole micro-batch's on every tp rank, under context
parallel each cp rank has its share of the sequence, under pipeline parallel only the last stage has a loss
(through the schedule's forward-only `eval`). The sums are added over pp and over dp x cp, in float64, and
divided by the set's token count: the token-weighted mean, identical in every layout up to the order of
floating-point sums. No gradient is computed, the optimizer and the training data loader are not touched, no
random number is drawn. Used by the trainer (every validation.freq steps) and by scripts/perplexity.py.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from torchtitan.data import build_dataloader
from torchtitan.data.dataset import validation_source
from torchtitan.errors import UserError
from torchtitan.loss import cross_entropy_loss
from torchtitan.parallel.pipeline import _step_accepts_return_outputs


@dataclass
class ValidationResult:
    loss_sum: float  # token cross-entropy summed over the whole validation set (every rank's share added)
    tokens: int  # tokens (label positions) in the validation set
    batches: int  # global batches
    seconds: float  # wall time of this evaluation


def validation_global_batch(cfg, dims) -> int:
    """G, checked: each dp rank's share must be a whole number of training micro-batches."""
    v, t = cfg.validation, cfg.training
    g = v.global_batch_size if v.global_batch_size != -1 else dims.global_batch_size(t)
    micro = t.local_batch_size * dims.dp
    if g % micro:
        raise UserError(
            f"validation.global_batch_size={g} is not a multiple of training.local_batch_size"
            f" {t.local_batch_size} x dp {dims.dp} = {micro} (each dp rank evaluates whole micro-batches);"
            f" use a multiple of {micro}"
        )
    return g


def load_validation_batches(cfg, tokenizer, dims, dp_rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This dp rank's micro-batches (CPU int64 [local_batch_size, seq_len] pairs) of the fixed validation set."""
    v, t = cfg.validation, cfg.training
    g = validation_global_batch(cfg, dims)
    dataset, dataset_path, key = validation_source(cfg)
    loader = build_dataloader(
        dataset=dataset,
        dataset_path=dataset_path,
        text_field=cfg.data.text_field,
        tokenizer=tokenizer,
        dp_rank=0,
        dp_world_size=1,
        batch_size=g,
        seq_len=t.seq_len,
        split=v.split,
        infinite=False,
        key=key,
    )
    batches = list(itertools.islice(loader, v.steps))
    if len(batches) < v.steps:
        raise UserError(
            f"validation data ({loader.name}, split {v.split}) holds {len(batches)} batches of {g} windows of"
            f" {t.seq_len + 1} tokens, fewer than validation.steps={v.steps}; lower validation.steps or"
            " validation.global_batch_size, or use more held-out data"
        )
    share = g // dims.dp
    mine = []
    for inputs, labels in batches:
        rows = slice(dp_rank * share, (dp_rank + 1) * share)
        micro = zip(inputs[rows].split(t.local_batch_size), labels[rows].split(t.local_batch_size))
        mine.extend((x.contiguous(), y.contiguous()) for x, y in micro)
    return mine


class Evaluator:
    """`due(step)`, then `run()` on every rank: the validation loss of the model as it is now.

    loss_fn(logits, labels, global_tokens) is the trainer's loss (summed cross-entropy / global_tokens); with
    `pp` = (schedule, has_first_stage, has_last_stage) the schedule's own loss divides by `pp_step_tokens`,
    which is multiplied back. loss_context and cp_context are the trainer's (loss_parallel, context parallel).
    """

    def __init__(
        self,
        cfg,
        dims,
        device: torch.device,
        tokenizer,
        model_parts: list[torch.nn.Module],
        loss_fn,
        loss_context=contextlib.nullcontext,
        cp_context=None,
        pp=None,
        pp_step_tokens: int = 1,
    ):
        self.cfg, self.dims, self.device = cfg, dims, device
        self.model_parts, self.loss_fn, self.loss_context = model_parts, loss_fn, loss_context
        self.cp_context = cp_context or (lambda inputs, labels: contextlib.nullcontext())
        self.pp, self.pp_step_tokens = pp, pp_step_tokens
        self.global_batch = validation_global_batch(cfg, dims)
        # Read now, before training: a missing or too short split fails at the start, not at step `freq`.
        dp_rank = dims.mesh("dp").get_local_rank()
        self.batches = load_validation_batches(cfg, tokenizer, dims, dp_rank)

    def due(self, step: int) -> bool:
        v = self.cfg.validation
        return v.enable and (step % v.freq == 0 or step == self.cfg.training.steps)

    def _loss_sum(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.pp is not None:
            schedule, has_first, has_last = self.pp
            losses = [] if has_last else None
            kwargs = {"target": labels if has_last else None, "losses": losses}
            if _step_accepts_return_outputs(schedule):
                kwargs["return_outputs"] = False
            with self.loss_context():
                schedule.eval(*((inputs,) if has_first else ()), **kwargs)
            if not has_last:
                return torch.zeros((), dtype=torch.float64, device=self.device)
            losses = [x.full_tensor() if isinstance(x, DTensor) else x for x in losses]
            return torch.stack([x.double() for x in losses]).sum() * self.pp_step_tokens
        (model,) = self.model_parts
        logits = model(inputs)
        with self.loss_context():
            loss = self.loss_fn(logits, labels, 1)
        return (loss.full_tensor() if isinstance(loss, DTensor) else loss).double()

    @torch.no_grad()
    def run(self) -> ValidationResult:
        start = time.perf_counter()
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for part in self.model_parts:
            part.eval()
        try:
            for inputs, labels in self.batches:
                # copies: context parallel shards its buffers in place, and the cached batches must stay whole
                inputs = inputs.to(self.device, copy=True)
                labels = labels.to(self.device, copy=True)
                with self.cp_context(inputs, labels):
                    total += self._loss_sum(inputs, labels)
        finally:
            for part in self.model_parts:
                part.train()
        if self.dims.pp_enabled:
            dist.all_reduce(total, group=self.dims.mesh("pp").get_group())  # only the last stage is non-zero
        dist.all_reduce(total, group=self.dims.mesh("dp_cp").get_group())
        seq_len = self.cfg.training.seq_len
        steps = self.cfg.validation.steps
        return ValidationResult(
            loss_sum=total.item(),
            tokens=steps * self.global_batch * seq_len,
            batches=steps,
            seconds=time.perf_counter() - start,
        )


def evaluate_checkpoint(cfg, checkpoint_path: str) -> tuple[ValidationResult, int | None]:
    """Validation loss of a checkpoint on cfg's [validation] data, in cfg's parallel layout; call on every rank.
    The checkpoint is found as scripts/generate.py finds it (torchtitan/generate/loader.py's find_checkpoint): a
    DCP step folder (full or model-only export), a checkpoint folder (its newest committed step) or a Hugging
    Face Llama folder. Returns (result, the checkpoint's step; None for a Hugging Face folder).

    The model is built as the trainer builds it (meta device -> parallelize -> materialize). Our checkpoints are
    loaded through the checkpoint manager (any saved layout reshards into this one), with the shape from the
    [model] section; a Hugging Face folder takes its shape from its config.json and every rank reads the full
    tensors (converted in memory) and keeps its slice. Nothing else is created.
    """
    import functools

    from torchtitan.checkpoint import CheckpointManager, verify_checkpoint
    from torchtitan.data import build_tokenizer, check_vocab
    from torchtitan.generate.loader import (
        checkpoint_model_args,
        find_checkpoint,
        load_full_weights,
        read_full_state_dict,
    )
    from torchtitan.models import get_model_class, model_args_from_config
    from torchtitan.parallel import (
        ParallelDims,
        init_distributed,
        materialize,
        parallelize,
        pick_device,
        pipeline_parallelize,
        plan_pipeline,
    )
    from torchtitan.parallel.context import build_cp_context
    from torchtitan.parallel.distributed import launch_world

    t, p = cfg.training, cfg.parallelism
    kind, folder = find_checkpoint(checkpoint_path)  # a one-line error for a missing or unknown folder
    if kind == "hf":
        step = None
        model_args = checkpoint_model_args(cfg, folder)
        model_args.max_seq_len = max(model_args.max_seq_len, t.seq_len)  # RoPE is defined at any position
    else:
        step = verify_checkpoint(str(folder))["step"]  # a one-line error for a broken folder
        model_args = model_args_from_config(cfg.model, t.seq_len)
    dims = ParallelDims.from_config(p, launch_world()[0])
    device = pick_device()
    dims.validate(model_args, cfg, device.type)
    plan = (
        plan_pipeline(p, model_args.n_layers, t.local_batch_size, model_args.tie_embeddings)
        if dims.pp > 1
        else None
    )
    rank, _ = init_distributed(device, cfg.comm.init_timeout_seconds)
    dims.build_mesh(device.type)
    tokenizer = build_tokenizer(cfg.model.tokenizer_path)
    hf_config = str(folder / "config.json") if kind == "hf" else None
    check_vocab(tokenizer, model_args.vocab_size, cfg.model.tokenizer_path, hf_config)
    with torch.device("meta"):
        model = get_model_class(cfg.model.name)(model_args)
    pp = None
    if plan is not None:  # the schedule's loss is the plain token sum (global_tokens=1)
        loss = functools.partial(cross_entropy_loss, global_tokens=1)
        schedule, model_parts, has_first, has_last = pipeline_parallelize(
            model, plan, dims, cfg, device, loss
        )
        pp = (schedule, has_first, has_last)
    else:
        model_parts = [parallelize(model, dims, cfg)]
    for part in model_parts:  # storage and the RoPE table; no random init: the load below sets every weight
        materialize(part, device)
    dp_rank = dims.mesh("dp").get_local_rank()
    if kind == "hf":
        sd = read_full_state_dict(kind, folder, model_args)
        load_full_weights(model_parts, sd, model_args, str(folder), cfg.model.flavor)
        del sd  # the full copy: gone before the evaluation runs
    else:
        c = cfg.checkpoint
        c.enable, c.async_mode, c.initial_load_path, c.initial_load_model_only = (
            False,
            "disabled",
            str(folder),
            True,
        )
        CheckpointManager(cfg, model_parts, None, None, None, rank=rank, dp_rank=dp_rank, dp=dims.dp).load()
    evaluator = Evaluator(
        cfg,
        dims,
        device,
        tokenizer,
        model_parts,
        cross_entropy_loss,
        loss_parallel if dims.tp_enabled and p.enable_loss_parallel else contextlib.nullcontext,
        build_cp_context(dims, p.context_parallel_rotate_method, model_parts, t.seq_len),
        pp,
    )
    return evaluator.run(), step
