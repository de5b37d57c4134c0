"""Peak device memory of a training step, per rank, by component (docs/estimate.md, "Memory model").

The peak is the largest of three moments:
  backward start  all saved activations of the micro-batches in flight, the loss buffers, FSDP's gathered and
                  gradient buffers, the sharded states (and the sharded gradients when several micro-steps
                  accumulate into them);
  optimizer step  parameters, gradients, both AdamW moments and the optimizer's temporaries (foreach: one fp32
                  copy of the parameters; fused: none);
  embedding backward  on a rank whose token embedding is split over TP: its gradient at the whole table's size
                  (embedding_backward_bytes) beside the states and the other passes in flight.
Figures are what CUDA's caching allocator reserves (torch.cuda.max_memory_reserved, what the trainer logs as
memory/max_reserved_gib): allocated bytes x (1 + fragmentation) + fixed pools. The allocator caches freed blocks
per stream, and FSDP2 allocates the sharded gradients in its reduce-scatter stream (`reduce_scatter_pool_bytes`),
so on a GPU they add to every moment rather than reuse what the compute stream freed. On CPU the figure is the
process's resident set: the measured runtime baseline (Python, torch, data libraries) plus the allocated bytes
and what glibc's heap keeps of them; where a calibration's probe ran the plan itself at two depths, the peak it
measured there, carried to the plan's depth (measured_rss).
"""

from __future__ import annotations

import statistics

from .activations import (
    WEIGHT_PASS_RECOMPUTED_PER_BLOCK,
    backward_working_set_per_token,
    block_modes,
    saved_per_token,
    weight_pass_grads_per_token,
)
from .plan import GIB, Plan

KEYS = (
    "parameters",
    "gradients",
    "optimizer_states",
    "activations",
    "logits_loss",
    "fsdp_buffers",
    "float8_extras",
    "allocator_and_comm_overhead",
)

# the training state: byte counts of the (sharded) weights, gradients and optimizer states
STATE_KEYS = KEYS[:3]


def state_gib(result: dict) -> float:
    """Of a training estimate, the part of its peak that is the training state (STATE_KEYS), in GiB."""
    return sum(result["memory_breakdown_gib"][k] for k in STATE_KEYS)


def rest_ratio(measured: float, anchor_peak: float, anchor_state: float) -> float:
    """A measured run's peak beyond its training state over its estimate's (`--estimate.anchor`'s memory ratio)."""
    return (measured - anchor_state) / (anchor_peak - anchor_state)


def scale_peak(peak: float, state: float, ratio: float) -> float:
    """A peak (GiB) scaled by a measured run (`--estimate.anchor`, anchor.py): its training state (byte counts, never
    scaled) plus the rest times `ratio`, the run's measured / estimated rest (`rest_ratio`)."""
    return state + (peak - state) * ratio


ADAMW_STATE_BYTES = 8  # exp_avg + exp_avg_sq, fp32
MASTER_BYTES = 4  # FSDP keeps parameters (and their gradients) in fp32: the optimizer's master copy
# Temporaries of one AdamW step, bytes per parameter, by implementation (torch/optim/adam.py, shared by AdamW):
# foreach (`_multi_tensor_adam`) allocates `exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)`, an fp32
# copy of every parameter of the device group at once, then updates in place; fused (`torch._fused_adamw_`, one
# multi-tensor kernel) and for-loop (one parameter's temporary at a time) keep none of the model's size.
ADAMW_TEMP_BYTES = {"foreach": 4, "fused": 0, "for-loop": 0}


def optimizer_state_bytes(plan: Plan) -> float:
    """Optimizer state per parameter: AdamW's two moments in the parameters' dtype (fp32, or bf16 with
    --estimate.model_dtype=bfloat16); plain SGD (--estimate.optimizer=sgd) keeps none."""
    if plan.cfg.estimate.optimizer == "sgd":
        return 0.0
    return ADAMW_STATE_BYTES * plan.param_bytes / MASTER_BYTES


def step_temp_bytes(plan: Plan) -> float:
    """The optimizer step's temporaries per parameter (ADAMW_TEMP_BYTES in the parameters' dtype); SGD without
    momentum updates in place (torch/optim/sgd.py, `_foreach_add_` of the gradients): none."""
    if plan.cfg.estimate.optimizer == "sgd":
        return 0.0
    return ADAMW_TEMP_BYTES.get(plan.cfg.optimizer.implementation, 4) * plan.param_bytes / MASTER_BYTES


def microbatches_per_round(plan: Plan) -> int:
    """Micro-batches torch's multi-stage schedules run on a local stage before moving to the next one: m over
    max(1, m // pp) rounds (torch 2.13, torch/distributed/pipelining/schedules.py, `ScheduleInterleaved1F1B` and
    `ScheduleInterleavedZeroBubble`): pp when m is a multiple of it, m when m < pp."""
    m = plan.n_microbatches
    return m // max(1, m // plan.pp)


def in_flight_by_stage(plan: Plan, rank: int) -> list[float]:
    """Forward passes whose saved activations a pipeline rank holds at its peak, per local stage (in stage order):
    a pass is held from its forward to its backward, under the zero-bubble schedules to its weight-gradient pass
    (torch's split backward keeps the graph, retain_graph=True, from the input-gradient pass to it). From each
    schedule's op order in torch 2.13 (`_calculate_single_rank_operations`); tests/test_estimate.py replays torch's
    orders against these counts.
    - GPipe: every micro-batch; 1F1B: min(m, pp - rank).
    - Interleaved1F1B: a warm-up of (v - 1) rounds plus 2 per later rank, and one more forward before the first
      backward, run in rounds of `microbatches_per_round` per local stage, cycling over the stages.
    - InterleavedZeroBubble: a round on every local stage but the last, which holds at most pp, whatever the rank
      (its warm-up adds 1 per later rank, not 2, and a rank's weight passes lag its input passes by `rank` ops,
      which holds the difference).
    - ZBVZeroBubble (m >= 2 pp): rank r's V holds 2 pp - 1 - r passes of its first stage and r + 1 of its second."""
    if plan.pp_plan is None:
        return [1.0]
    p, m = plan.pp, plan.n_microbatches
    v = plan.cfg.parallelism.pipeline_parallel_stages_per_rank
    schedule = plan.pp_plan.schedule
    if schedule == "GPipe":
        return [float(m)]
    if schedule == "1F1B":
        return [float(min(m, p - rank))]
    per_round = microbatches_per_round(plan)
    if schedule == "ZBVZeroBubble":
        return [float(min(m, 2 * p - 1 - rank)), float(min(m, rank + 1))]
    if schedule == "InterleavedZeroBubble":
        return [float(per_round)] * (v - 1) + [float(min(per_round, p))]
    warm_up = min(m * v, (v - 1) * per_round + 2 * (p - 1 - rank) + 1)
    counts = [0.0] * v
    for i in range(warm_up):
        counts[(i // per_round) % v] += 1
    return counts


def in_flight_passes(plan: Plan, rank: int) -> float:
    """Forward passes (of one stage chunk each) whose activations a pipeline rank holds at its peak."""
    return sum(in_flight_by_stage(plan, rank))


def split_backward_moments(plan: Plan, rank: int) -> list[tuple[float, float]]:
    """The moments a pipeline rank's saved activations can peak at: (passes held, how many of them are past their
    input-gradient pass), one stage chunk each. Only the zero-bubble schedules have passes in that second state,
    each holding the gradients its weight pass reads beside its saved activations until that pass
    (`activations.weight_pass_grads_per_token`), so their peak is either where most passes are held or where most
    are in that state (from torch 2.13's op orders, as `in_flight_by_stage`; tests/test_estimate.py replays them):
    - InterleavedZeroBubble: both at once: every held pass of `in_flight_by_stage`, rank + 1 of them past input.
    - ZBVZeroBubble: 2 pp held, one past input (the steady state), and, on rank r >= 1, pp + r held with 2 r + 1
      past input (its cool-down runs r input passes of each stage before their weight passes)."""
    held = in_flight_passes(plan, rank)
    if not plan.split_backward:
        return [(held, 0.0)]
    if plan.pp_plan.schedule == "InterleavedZeroBubble":
        return [(held, min(held, rank + 1.0))]
    moments = [(held, 1.0)]
    if rank >= 1:
        moments.append((float(plan.pp + rank), 2.0 * rank + 1))
    return moments


def pipeline_buffer_bytes(plan: Plan, rank: int) -> float:
    """Bytes of a pipeline rank's stage-boundary tensors beyond the saved activations (torch 2.13,
    torch/distributed/pipelining/stage.py, `PipelineStage`): every non-first stage allocates one receive buffer per
    micro-batch (`_setup_forward_recv_info`: m buffers, kept across steps), which the received pass uses as its
    input (`_retrieve_recv_activations`: `info.buffer.requires_grad_()`, so the in-flight passes' first-block
    inputs, already counted, are those buffers); every non-last stage allocates one gradient receive buffer per
    micro-batch (`_create_grad_recv_info`) and keeps each in-flight pass's output in `fwd_cache` until its backward
    (the last block's output, which no checkpoint of the stage saves). Each is one micro-batch's residual stream:
    tokens per pass x d_s (d / tp under sequence parallel) x the activation bytes."""
    if plan.pp_plan is None:
        return 0.0
    m, last = plan.n_microbatches, plan.pp_plan.num_stages - 1
    boundary = plan.tokens_per_pass * plan.shape.d_s * plan.act_bytes
    n = 0.0
    for stage, flying in zip(plan.pp_plan.stages_of_rank(rank), in_flight_by_stage(plan, rank)):
        if stage > 0:
            n += max(0.0, m - flying)  # receive buffers not holding an in-flight pass's input
        if stage < last:
            n += m + flying  # gradient receive buffers + outputs of the passes in flight
    return n * boundary


def kept_stage_outputs(plan: Plan) -> int:
    """Outputs (logits, the model's activation dtype) of earlier micro-batches the last pipeline stage still holds at
    its peak. torch's pipelining appended every micro-batch's last-stage output to `output_chunks` and `step()`
    returned them merged (torch/distributed/pipelining/stage.py `forward_one_chunk`, schedules.py `step`), so they
    lived until the step ended; pytorch/pytorch#165822 (Oct 2025) added `step(return_outputs=False)`, which this
    trainer passes (torchtitan adopted it in e5ef99aab, "Update PP to release memory earlier"). With outputs kept,
    all m are alive at the last micro-batch's backward on the last stage, while the rank holds as many passes in
    flight as at its peak (1F1B: that one pass; interleaved: its earlier stages' chunks wait for their backward
    until the last stage's are done); with outputs released, nothing beyond the loss buffers."""
    if plan.pp_plan is None or plan.cfg.estimate.pp_outputs != "kept":
        return 0
    return plan.n_microbatches


def gather_bytes(plan: Plan, linear_share_fp8: float) -> float:
    """Bytes per parameter of a gathered block: float8 all-gather moves the converted weights as 1 byte."""
    b = plan.act_bytes
    if plan.float8_all_gather:
        return linear_share_fp8 * 1 + (1 - linear_share_fp8) * b
    return b


def fp8_param_share(plan: Plan) -> float:
    """Share of a block's parameters in float8-converted linears."""
    mats = sum(lin.in_features * lin.out_features for lin in plan.block_linears)
    conv = sum(lin.in_features * lin.out_features for lin in plan.block_linears if lin.float8)
    return conv / mats if mats else 0.0


def _fsdp_rows(rows: int, n: int, index: int) -> int:
    """Rows of dimension 0 that FSDP2's Shard(0) gives shard `index` of `n` (torch.chunk: ceil-sized chunks, the
    last ones shorter or empty)."""
    chunk = -(-rows // n)
    return max(0, min(chunk, rows - index * chunk))


def fsdp_shard_params(plan: Plan, rank: int, index: int = 0) -> int:
    """Parameters FSDP shard `index` (of dp_shard x cp) of pipeline rank `rank` holds, tensor by tensor: TP splits
    first (column-wise linears and the vocabulary on rows, row-wise linears on columns), FSDP then chunks each
    tensor's rows. Index 0 holds the largest shard; with small tensors over many ranks, later ones hold less."""
    n, tp, d = plan.fsdp_degree, plan.tp, plan.args.dim
    n_blocks, has_emb, has_head = plan.rank_layers()[rank]

    def shard(rows: int, cols: int) -> int:
        return _fsdp_rows(rows, n, index) * cols

    block = 2 * shard(d, 1)  # attention_norm, ffn_norm
    for lin in plan.block_linears:
        block += (
            shard(lin.out_features // tp, lin.in_features)
            if lin.colwise
            else shard(lin.out_features, lin.in_features // tp)
        )
    vocab_rows = plan.args.vocab_size // plan.head_tp_shards
    total = n_blocks * block
    if has_emb:
        total += shard(plan.args.vocab_size // plan.embedding_tp_shards, d)
    if has_head:
        total += shard(d, 1) + (0 if plan.args.tie_embeddings else shard(vocab_rows, d))
    return total


def rank_params(plan: Plan, rank: int) -> tuple[float, float]:
    """(parameters of pipeline rank `rank`'s stages after TP, the part of them the largest FSDP shard holds)."""
    n_blocks, has_emb, has_head = plan.rank_layers()[rank]
    p_rank = (
        n_blocks * plan.block_params()
        + (plan.embedding_params() if has_emb else 0)
        + (plan.head_params() if has_head else 0)
    )
    # FSDP chunks every tensor's rows: shard 0 holds ceil-sized chunks, p_rank / n only when every row count divides
    return p_rank, float(fsdp_shard_params(plan, rank, 0))


def state_bytes(plan: Plan, rank: int, fsdp_index: int = 0) -> dict[str, float]:
    """Parameters, gradients and AdamW moments pipeline rank `rank`, FSDP shard `fsdp_index`, holds once its
    optimizer has stepped, in bytes, whatever the moment of the peak: what the fake-backend simulation counts
    from its tensors."""
    p_local = fsdp_shard_params(plan, rank, fsdp_index)
    offload = plan.cfg.parallelism.fsdp_cpu_offload
    return {
        "parameters": 0.0 if offload else plan.param_bytes * p_local,
        "gradients": 0.0 if offload else plan.param_bytes * p_local,
        "optimizer_states": 0.0 if offload else optimizer_state_bytes(plan) * p_local,
    }


def autocast_weight_copies(plan: Plan, n_blocks: int, has_head: bool, modes: list[str]) -> float:
    """Bytes of the bf16 weight copies autocast makes that are alive at the start of backward (no FSDP wrapper).

    Autocast casts the inputs of the ops on its lower-precision list (linear, matmul, mm, ...; torch's "Automatic
    Mixed Precision package" op reference): each linear's fp32 weight once per forward, kept by autograd for the
    input gradient. The embedding lookup is not on the list: its table is never copied. A float8-converted linear
    casts its fp32 weight straight to float8 and saves the fp32 weight itself for backward (torchao
    float8/float8_linear.py, `matmul_with_hp_or_float8_args`): no bf16 copy. A checkpointed block (full, or
    selective per-op, whose policy recomputes every op outside its save list, the cast `_to_copy` included:
    torchtitan/parallel/activation_checkpoint.py) keeps none: backward recasts them, one block at a time.
    """
    lin_bytes = (
        sum(
            lin.in_features * lin.out_features
            for lin in plan.block_linears
            if not (plan.float8 and lin.float8)
        )
        / plan.tp
        * plan.act_bytes
    )
    kept = sum(1 for m in modes if m == "none")
    copies = kept * lin_bytes + (lin_bytes if kept < n_blocks else 0.0)  # + the block recasting in backward
    if has_head:  # the output linear (a tied head casts the embedding table: its copy all the same)
        copies += plan.head.in_features * plan.head.out_features / plan.head_tp_shards * plan.act_bytes
    return copies


def saved_float8_weight_bytes(plan: Plan, modes: list[str]) -> float:
    """Bytes of float8 weights older software kept from a forward to its backward (`--estimate.float8_weights=saved`),
    per pass in flight.

    torchao's Float8Linear of 2024 to mid-2025 cast the weight to float8 outside its autograd function and saved the
    float8 copy (torchao float8/float8_linear.py, `matmul_with_hp_or_float8_args`: `ctx.save_for_backward(input_hp,
    weight_hp_t)` with the cast weight). Under torch.compile the partitioner chose the same: it "may decide to save
    the fp8_weight_transpose for backward, which is an un-sharded weight" (torchao's comment on
    `force_recompute_fp8_weight_in_bwd`, whose checkpoint forced the recast; pytorch/pytorch#141881 "Partitioner
    stores fp8 copy of all weights between fwd and bwd"), until pytorch/pytorch#148922 (2025-03) made the partitioner
    treat parameters as free to save, so it keeps the weight itself and recasts. torchtitan exposed the workaround in
    its PR #833 (2025-02-18, off by default). So each converted linear of a block that is not checkpointed holds its
    whole (unsharded, 1/TP) weight at 1 byte until that block's backward; a checkpointed block (full, or per-op
    selective: the cast is outside the save list) recasts in its recompute, one block at a time (transient).
    """
    if not plan.float8 or plan.cfg.estimate.float8_weights != "saved":
        return 0.0
    per_block = sum(lin.in_features * lin.out_features for lin in plan.block_linears if lin.float8) / plan.tp
    return per_block * sum(1 for m in modes if m == "none")


def embedding_backward_bytes(plan: Plan) -> float:
    """Bytes the token embedding's weight gradient holds while it is made, on a rank whose embedding rows are split
    over tensor parallelism. DTensor computes aten.embedding_dense_backward with one of the strategies of torch
    2.13's torch/distributed/tensor/_ops/_embedding_ops.py (`embedding_dense_backward_strategy`): a gradient
    sharded on the embedding dimension, or Partial (every rank a whole-table sum of its own tokens); none is
    sharded on the rows (the vocabulary). For the rowwise embedding it picks Partial, with or without sequence
    parallel (measured on a simulated rank of FSDP 32 x TP 8, 70B: a bf16 (128256, 8192) gradient, 1.96 GiB),
    and redistributes it to this rank's rows (a reduce-scatter): the whole table and this rank's rows, in the
    gradients' dtype, alive together once per pass. Where FSDP accumulates the passes' gradients unsharded before
    one reduce-scatter (PP, no_sync), it adds each pass's Partial table into a Partial accumulator of the whole
    table in the reduce dtype (counted with the unsharded gradients, rank_memory) and redistributes only that,
    after the last pass: each pass then holds its whole bf16 table alone (measured on a simulated first stage of
    405B under FSDP 8 x TP 8 x PP 8, 1F1B: a bf16 and an fp32 (65536, 16384) table at its peak)."""
    if plan.embedding_tp_shards == 1:  # no TP, or the table replicated on every TP rank
        return 0.0
    full = plan.embedding_grad_params() * plan.act_bytes
    return full if holds_unsharded_grads(plan) else full + full / plan.tp


def later_chunks_done_at_embedding(plan: Plan) -> bool:
    """Whether a rank's later stage chunks have finished the step's backwards before its first chunk's first one:
    torch's Interleaved1F1B runs backwards in rounds of pp micro-batches per chunk, the last chunk first, so with one
    round (m <= pp) every later chunk is done, its unsharded gradients reduce-scattered and its blocks resharded,
    when the first chunk's embedding backward comes (counted on a simulated 405B first rank, stages 0 and 8: one
    chunk's block gathered and accumulating at m = pp = 8, both at m = 16)."""
    pp_plan = plan.pp_plan  # Interleaved1F1B always has several stages per rank (parallel/pipeline.py)
    return pp_plan is not None and pp_plan.schedule == "Interleaved1F1B" and plan.n_microbatches <= plan.pp


def holds_unsharded_grads(plan: Plan) -> bool:
    """Whether FSDP keeps the stage's gradients unsharded, in the reduce dtype, across the passes of a step and
    reduce-scatters them after the last (PP, or no_sync over micro-steps: estimate.dp_grad_sync=step)."""
    return plan.pp_plan is not None or plan.unsharded_grad_passes > 1


def accumulated_grad_params(plan: Plan, p_rank: float, has_emb: bool) -> float:
    """Elements of the unsharded gradients FSDP accumulates across passes for a stage of `p_rank` parameters (after
    TP): its parameters, the TP-split embedding's counted as its whole Partial table (Plan.embedding_grad_params)."""
    return p_rank + (plan.embedding_grad_params() - plan.embedding_params() if has_emb else 0.0)


def backward_working_set(plan: Plan, modes: list[str]) -> float:
    """Bytes per token alive beyond the saved activations while a backward runs: one block's
    (`backward_working_set_per_token`), or under a zero-bubble schedule with checkpointed blocks the weight pass's
    recomputed activations, which pile up over its per-group autograd calls (WEIGHT_PASS_RECOMPUTED_PER_BLOCK per
    checkpointed block of a stage chunk)."""
    s = plan.shape
    one_block = max(backward_working_set_per_token(m, s, plan.compile_model) for m in set(modes))
    if not plan.split_backward:
        return one_block
    v = plan.cfg.parallelism.pipeline_parallel_stages_per_rank
    # checkpointed blocks of a chunk (per-op SAC is refused with these schedules: every one is whole-block)
    checkpointed = sum(m != "none" for m in modes) / v
    return max(one_block, WEIGHT_PASS_RECOMPUTED_PER_BLOCK * checkpointed * saved_per_token("none", s, False))


def split_weight_grad_params(plan: Plan, p_rank: float, has_emb: bool) -> float:
    """Parameters (after TP) whose gradients a zero-bubble rank holds twice: the weight pass sets each parameter's
    .grad in the compute dtype, and FSDP folds it into its accumulator only in the post-backward hook of the
    stage's next input-gradient pass (counted on a simulated ZBV rank: a bf16 copy of every block's gradients
    beside the fp32 accumulators between passes). Not the first stage's, whose backward runs whole, hooks included
    (`Plan.whole_backward_blocks`)."""
    if not has_emb:
        return p_rank
    return p_rank - plan.whole_backward_blocks(has_emb) * plan.block_params() - plan.embedding_params()


def reduce_scatter_pool_bytes(plan: Plan, p_local: float) -> float:
    """Bytes the caching allocator holds for FSDP2's reduce-scatter stream: the sharded gradients.

    FSDP2 allocates each reduce-scatter's output, which becomes the sharded gradient (a view of it, in the reduce
    dtype, cast to the parameters' fp32 on the same stream when they differ), inside its reduce-scatter stream
    (torch 2.13, torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py `foreach_reduce`: "the GPU sharded
    gradient is allocated in the RS stream"); its author: the outputs "are still allocated in the separate
    reduce_scatter stream ... we iteratively allocate them through backward and free them altogether after
    optimizer" (pytorch/pytorch#129721, which moved the larger reduce-scatter input to the default stream). CUDA's
    caching allocator serves an allocation only from blocks cached for the same stream, so the compute stream never
    reuses these blocks after zero_grad frees them, nor the reduce-scatter stream the activations' blocks: reserved
    memory is the compute stream's peak plus 4 B per local parameter (2 B for a bf16 model,
    --estimate.model_dtype=bfloat16). CPU has no streams (the gradients reuse what
    the step freed, as before); no FSDP wrapper (autocast) leaves the gradients to autograd on the compute stream;
    CPU offload moves them to the host.
    """
    if plan.hw.is_cpu or not plan.fsdp_wrapped or plan.cfg.parallelism.fsdp_cpu_offload:
        return 0.0
    return plan.param_bytes * p_local  # the parameters' dtype: fp32 here, bf16 for a bf16 model


def rank_memory(plan: Plan, rank: int) -> dict[str, float]:
    """Bytes of every component at the peak on pipeline rank `rank` (0 without PP)."""
    eff, s = plan.eff, plan.shape
    n_blocks, has_emb, has_head = plan.rank_layers()[rank]
    v = plan.cfg.parallelism.pipeline_parallel_stages_per_rank if plan.pp_plan else 1
    p_blk = plan.block_params()
    p_rank, p_local = rank_params(plan, rank)
    n = plan.fsdp_degree
    sharded = n > 1
    # sharded gradients persist from one micro-step to the next (FSDP without no_sync; DDP's unsharded ones either way)
    accumulating = plan.accum > 1 and plan.pp_plan is None and plan.unsharded_grad_passes == 1
    unsharded_grads_held = holds_unsharded_grads(plan)
    tokens = plan.tokens_per_pass

    params = 0.0 if plan.cfg.parallelism.fsdp_cpu_offload else plan.param_bytes * p_local
    states = 0.0 if plan.cfg.parallelism.fsdp_cpu_offload else optimizer_state_bytes(plan) * p_local

    # ---- activations: blocks of the passes in flight, plus the final norm's gathered output for the head ----
    modes = block_modes(
        plan.cfg.activation_checkpoint.mode, plan.cfg.activation_checkpoint.selective_ac_option, n_blocks
    )
    per_pass_blocks = sum(saved_per_token(m, s, plan.compile_model) for m in modes) / v  # one chunk's blocks
    passes = in_flight_passes(plan, rank)
    # a zero-bubble pass past its input-gradient pass also keeps the gradients its weight pass reads
    split_extra = len(modes) * weight_pass_grads_per_token(s) / v
    acts = tokens * max(
        held * per_pass_blocks + split * split_extra for held, split in split_backward_moments(plan, rank)
    )
    if has_head:
        acts += tokens * plan.args.dim * plan.act_bytes
    acts += backward_working_set(plan, modes) * tokens
    pipeline_buffers = pipeline_buffer_bytes(plan, rank)
    acts += pipeline_buffers

    # ---- logits and loss: fp32 upcast of [tokens, vocab] and its gradient (eager), or bf16 in and out (compiled)
    logits = 0.0
    if has_head:
        vocab = plan.loss_vocab
        eager_bytes = plan.act_bytes if plan.cfg.estimate.eager_loss == "bf16" else 4  # the loss's own dtype
        per_logit = 2 * plan.act_bytes if plan.compile_loss else 3 * eager_bytes
        logits = tokens * vocab * per_logit
        logits += kept_stage_outputs(plan) * tokens * vocab * plan.act_bytes

    # ---- FSDP: gathered copies and unsharded gradients ----
    gb = gather_bytes(plan, fp8_param_share(plan))
    policy = plan.cfg.parallelism.fsdp_reshard_after_forward
    keep_blocks = (not sharded) or plan.pp_plan is not None or policy == "never"
    gathered = 0.0
    grads = plan.param_bytes * p_local if accumulating else 0.0
    if not sharded:
        # nothing sharded: the unsharded fp32 gradients fill up during backward (counted at the end of it). Without
        # an FSDP wrapper (issue 10: autocast) the weights' bf16 copies are `autocast_weight_copies`; FSDP applied
        # on one shard (replicate-only, or CPU offload) keeps a bf16 copy of every weight.
        if plan.autocast:
            gathered = autocast_weight_copies(plan, n_blocks, has_head, modes)
        elif plan.bf16_model:  # the bf16 parameters are what the matmuls read: no copy
            gathered = 0.0
        else:
            gathered = p_rank * (plan.act_bytes if plan.act_bytes == 2 else 0)
        grad_buffers = 0.0
    else:
        if keep_blocks:
            gathered += n_blocks * p_blk * gb
        else:
            gathered += 2 * p_blk * gb  # the block running and the one prefetched
        if has_head:
            gathered += plan.head_params() * plan.act_bytes  # the head unit stays gathered for backward
        if has_emb and (keep_blocks or policy == "never"):
            gathered += plan.embedding_params() * plan.act_bytes
        # backward: the running block's low-precision gradients and the reduce-dtype copies of two blocks in flight
        grad_buffers = p_blk * (plan.act_bytes + 2 * plan.reduce_bytes)
        if unsharded_grads_held:
            grad_buffers = accumulated_grad_params(plan, p_rank, has_emb) * plan.reduce_bytes
            if plan.split_backward:
                grad_buffers += split_weight_grad_params(plan, p_rank, has_emb) * plan.act_bytes
    fsdp = gathered + grad_buffers

    # ---- float8: the casted (and transposed) operands of the largest converted matmul ----
    f8 = 0.0
    if plan.float8 and any(lin.float8 for lin in plan.block_linears):
        widest = max(lin.in_features + lin.out_features for lin in plan.block_linears if lin.float8) / plan.tp
        f8 = 2 * tokens * widest  # 1 byte each, plus the transposed copy for the weight gradient
    f8 += passes * saved_float8_weight_bytes(plan, modes) / v  # older software: forward's float8 weights kept

    # the sharded gradients, in the reduce-scatter stream's own pool on a GPU (at every moment), else on the
    # compute stream (at the start of backward only when micro-steps accumulate into them)
    rs_pool = reduce_scatter_pool_bytes(plan, p_local)
    if rs_pool:
        grads = rs_pool
    backward_start = params + states + grads + acts + logits + fsdp + f8
    # gradients + the optimizer's temporaries (reported under "gradients")
    step_grads = (plan.param_bytes + step_temp_bytes(plan)) * p_local
    optimizer_phase = params + states + step_grads
    # the token embedding's backward under TP (the last op of a first stage's backward): its weight gradient at the
    # whole table's size, reduce-scattered to this rank's rows, while the other passes in flight keep theirs
    emb_grad = embedding_backward_bytes(plan) if has_emb else 0.0
    # (the running block's gradient buffers are gone by then, unless they are the stage's unsharded accumulation)
    emb_acts = (passes - 1) * per_pass_blocks * tokens + pipeline_buffers
    emb_fsdp = fsdp if unsharded_grads_held else fsdp - grad_buffers
    if sharded and unsharded_grads_held and later_chunks_done_at_embedding(plan):
        # the rank's later chunks have reduce-scattered their accumulators and resharded their blocks
        later_blocks = n_blocks * (v - 1) / v
        emb_fsdp -= later_blocks * p_blk * (gb + plan.reduce_bytes)
    embedding_backward = params + states + grads + emb_grad + emb_acts + emb_fsdp
    if emb_grad and embedding_backward > max(backward_start, optimizer_phase):
        parts = {"parameters": params, "gradients": grads + emb_grad, "optimizer_states": states,
                 "activations": emb_acts, "logits_loss": 0.0, "fsdp_buffers": emb_fsdp, "float8_extras": 0.0}  # fmt: skip
    elif optimizer_phase > backward_start:
        parts = {"parameters": params, "gradients": step_grads, "optimizer_states": states}
        parts.update({k: 0.0 for k in ("activations", "logits_loss", "fsdp_buffers", "float8_extras")})
    else:
        parts = {
            "parameters": params,
            "gradients": grads,
            "optimizer_states": states,
            "activations": acts,
            "logits_loss": logits,
            "fsdp_buffers": fsdp,
            "float8_extras": f8,
        }
    allocated = sum(parts.values())
    measured = measured_rss(plan)
    if measured is not None:
        # the trainer's own resident peak on this plan, measured at two depths: what it holds beyond the model's
        # tensors (runtime, heap retention, and whatever the tensors above miss) is this key's, of either sign
        parts["allocator_and_comm_overhead"] = measured * GIB - allocated
    elif plan.hw.is_cpu:
        # the measured runtime (imports, data, process group, kernels paged in) and what glibc's heap keeps of the
        # tensors a step frees (measured in the planned world where the calibration could, else the ratio alone);
        # without a measured runtime (preflight, simulated ranks) the tensors alone
        cal = plan.calibration
        runtime = cal.runtime_rss_gib if cal else None
        if runtime is None:
            parts["allocator_and_comm_overhead"] = 0.0
        elif cal.heap_retention_gib is not None and cal.probe_tensors_gib is not None:
            # measured in the planned world and layout on one block per stage: what the heap kept at that probe's
            # peak, and the measured ratio for the tensors this plan holds beyond the probe's
            beyond = max(0.0, allocated - cal.probe_tensors_gib * GIB)
            retained = cal.heap_retention_gib * GIB + beyond * eff.cpu_heap_retention
            parts["allocator_and_comm_overhead"] = runtime * GIB + retained
        else:
            parts["allocator_and_comm_overhead"] = runtime * GIB + allocated * eff.cpu_heap_retention
    else:
        parts["allocator_and_comm_overhead"] = allocated * eff.fragmentation + eff.allocator_fixed_gib * GIB
    return parts


def measured_rss(plan: Plan) -> float | None:
    """GiB: rank 0's peak resident memory of the trainer's own steps on this plan, from a CPU calibration's probe
    (calibrate.planned_heap_probe, glibc's defaults: the trainer's malloc regime) at one block per stage and at up
    to three, carried along the line through the two to the plan's blocks (Plan.along_probed_depths; the runs of a
    depth averaged: a peak's spread is the heap's layout, of either sign). Not under pipeline parallelism, where
    rank 0 holds the first stage and the estimate is the worst rank's. None where the probe did not run this
    plan."""
    cal = plan.calibration
    if cal is None or plan.pp_plan is not None:
        return None
    return plan.along_probed_depths(cal.probe_rss_gib, statistics.fmean)


def nccl_communicators(plan: Plan) -> int:
    """The process groups of more than one rank a step communicates on: FSDP's (dp_shard x cp), HSDP's replicas,
    TP's, CP's ring and PP's stages, each an NCCL communicator with its own device buffers."""
    d = plan.dims
    return sum(n > 1 for n in (plan.fsdp_degree, d.dp_replicate, d.tp, d.cp, d.pp))


def outside_allocator_gib(plan: Plan) -> float:
    """GiB a GPU rank holds outside torch's allocator, which `fits` keeps off the device: the CUDA context with one
    communicator's NCCL buffers, and each further communicator's buffers."""
    return plan.eff.cuda_context_gib + plan.eff.nccl_communicator_gib * max(0, nccl_communicators(plan) - 1)


def training_memory(plan: Plan) -> dict:
    """Per-rank peak memory (the worst pipeline rank) with its breakdown, in GiB, and whether it fits."""
    ranks = range(plan.pp) if plan.pp_plan is not None else [0]
    per_rank = [rank_memory(plan, r) for r in ranks]
    by_rank = [sum(p.values()) / GIB for p in per_rank]  # rank 0 (the first stage) first: the peak a run logs
    worst = max(range(len(per_rank)), key=lambda r: by_rank[r])
    parts = per_rank[worst]
    total = sum(parts.values())
    reserve = 0.0 if plan.hw.is_cpu else outside_allocator_gib(plan)
    usable = (plan.hw.memory_gib - reserve) * GIB
    return {
        "memory_gib": total / GIB,
        "memory_breakdown_gib": {k: parts[k] / GIB for k in KEYS},
        "peak_pipeline_rank": worst if plan.pp_plan is not None else None,
        "memory_by_pipeline_rank_gib": by_rank if plan.pp_plan is not None else None,
        "device_memory_gib": plan.hw.memory_gib,
        "fits": total <= usable,
        "memory_over_usable": total / usable,  # the fits check's ratio: fits <= 1
    }
