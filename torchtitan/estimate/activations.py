"""Activation memory and recomputation per transformer block, per activation-checkpointing mode: the ONE place.

Everything is per token of the micro-batch a rank holds (local_batch x seq_len / cp) and per block, in bytes.
Shapes per rank: d = model dim, h = n_heads*head_dim / tp (query width), kv = n_kv_heads*head_dim / tp,
f = ffn_hidden_dim / tp, d_s = the residual stream's width per token of T: d / tp under sequence parallel, else d.
Colwise matmuls (wq, wk, wv, w1, w3) save their input all-gathered to full width d (torch's ColwiseParallel saves
the gathered tensor); rowwise ones (wo, w2) produce a full-width partial sum before the reduce-scatter.

The modes, as this framework applies them (torchtitan/parallel/activation_checkpoint.py, with issue 10's policy):
  none       every tensor autograd keeps for backward.
  full       the block input only; backward re-runs the block's forward (matmuls, attention, elementwise).
  op         selective per-op: the outputs of every SECOND matmul in execution order (wq, wv, w1, w2 of
             wq wk wv wo w1 w3 w2 -- torchtitan's policy), attention (output + logsumexp) and, under tensor
             parallel with sequence parallel, the reduce-scatter outputs are kept; everything else is recomputed.
             (--estimate.sac_saves_attention=false: attention is not kept but recomputed, as torchtitan's save list
             before its PR #2095 of 2025-12 did for cuDNN attention, `_scaled_dot_product_cudnn_attention`.)
  N (digits) every N-th block fully checkpointed, the others as `none`.
Attention is SDPA flash: it keeps q, k, v, its output and the row logsumexp (fp32), never the S x S scores; K/V
are kept at n_kv_heads width (native grouped-query attention, issue 10). RMSNorm is torch's fused kernel on CUDA
(keeps its input and the row rstd); on CPU torch.rms_norm is composite and also keeps the fp32 upcast input and
the normalized tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

BF16 = 2  # activations are kept in the compute dtype (bf16)
MATMUL_ORDER = ("wq", "wk", "wv", "wo", "w1", "w3", "w2")  # execution order inside a block
OP_SAVED_MATMULS = MATMUL_ORDER[0::2]  # selective "op": the 1st, 3rd, 5th, 7th matmul outputs are kept


@dataclass(frozen=True)
class BlockShape:
    d: int  # model dim
    h: int  # query width per rank
    kv: int  # key/value width per rank
    f: int  # FFN hidden per rank
    heads: int  # query heads per rank
    tp: int
    sequence_parallel: bool
    act_bytes: int = BF16  # 4 for an fp32 run
    # torch.rms_norm has a fused kernel on CUDA; elsewhere it is composite (fp32 upcast)
    fused_norm: bool = True
    # selective "op" keeps the attention output (false: the SDPA op is not in the save list and is recomputed)
    op_saves_attention: bool = True
    # full AC's recompute skips the block's last matmul (w2) and its TP collective (early stop, or compiled)
    recompute_stops_early: bool = True
    # bytes of a residual-stream element between and inside blocks: the activation dtype under FSDP's mixed
    # precision; 4 under autocast (no FSDP wrapper), where the embedding's fp32 output plus the blocks' bf16 branch
    # outputs promote the stream to fp32 (torchtitan/parallel/mixed_precision.py); 0 = act_bytes
    stream_bytes: int = 0
    # compiled float8: the matmul-input groups ("attn" = wq/wk/wv, "wo", "ffn" = w1/w3, "w2") whose every consumer is
    # a float8 linear (f8_inputs), and those with some but not all (f8_partial); saved_per_token says what the
    # partitioner keeps of each
    f8_inputs: frozenset = frozenset()
    f8_partial: frozenset = frozenset()

    @property
    def sb(self) -> int:
        """Bytes of one residual-stream element."""
        return self.stream_bytes or self.act_bytes

    @property
    def d_s(self) -> float:
        return self.d / self.tp if (self.sequence_parallel and self.tp > 1) else self.d


def saved_per_token(mode: str, s: BlockShape, compiled: bool) -> float:
    """Bytes one block keeps for backward per token, in `mode` ('none', 'full' or 'op')."""
    b = s.act_bytes
    lse = 4 * s.heads / b  # attention's fp32 logsumexp per query row, in units of activation elements
    stream = s.sb / b  # a residual-stream element in units of activation elements
    if mode == "full":
        return s.d_s * s.sb  # the checkpointed block's input
    if mode == "op":
        kept = s.d_s * stream  # block input (checkpoint input)
        kept += s.h + s.kv  # wq and wv outputs (1st and 3rd matmul)
        if s.op_saves_attention:
            kept += s.h + lse  # attention output + logsumexp
        kept += s.f  # w1 output (5th)
        sp = s.tp > 1 and s.sequence_parallel
        if not compiled:
            # eager SAC caches every save-list output as its op runs (torch.utils.checkpoint's caching dispatch
            # mode), needed by backward or not: w2's output (7th; a full-width partial sum under TP) and, under
            # TP + SP, both reduce-scatter outputs
            kept += s.d + (2 * s.d_s if sp else 0)
        elif sp:
            # compiled, the partitioner saves only what the backward graph reads: the attention half's
            # reduce-scatter output (with the block input it rebuilds the FFN norm's input); nothing reads w2's
            # output or the FFN half's reduce-scatter output (the residual add's backward needs neither)
            kept += s.d_s
        return kept * b
    if mode == "none":
        if compiled:
            # Inductor's min-cut partitioner saves every matmul's input and output it cannot recompute cheaply and
            # recomputes the mid-block residual: the block input, both norm outputs (the matmuls' inputs, gathered
            # under TP), q and k after RoPE and v, the attention output + logsumexp and wo's input (its transposed
            # copy), w1 and w3 outputs and w2's input (the SiLU product). Measured: scripts/compiled_saved.py.
            # float8 (torchao's tensorwise Float8Linear, measured the same way with --float8): a group whose every
            # linear is converted saves no float8 cast and no input: backward rebuilds the input from what it keeps
            # anyway and recasts it -- the attention norm's output from the block input, wo's input from the
            # attention output, w2's input from w1's and w3's outputs; for the FFN norm's input it keeps wo's output
            # (d wide) in place of the norm's output, with which and the block input the mid-block residual is
            # rebuilt. A group with only some linears converted keeps its input and the 1-byte cast beside it.
            def inp(group: str, width: float, all_f8: float = 0.0) -> float:
                if group in s.f8_inputs:
                    return all_f8
                return width * (1 + (1 / b if group in s.f8_partial else 0.0))

            kept = s.d_s * stream + inp("attn", s.d) + inp("ffn", s.d, all_f8=s.d) + inp("wo", s.h)
            kept += (s.h + 2 * s.kv) + (s.h + lse) + 2 * s.f + inp("w2", s.f)
        else:
            # eager: both norms' inputs (stream), both gathered norm outputs, q and k after RoPE and v, attention
            # output + logsumexp and its transposed copy (wo's input), w1 and w3 outputs, SiLU output, product.
            kept = 2 * s.d_s * stream + 2 * s.d + (s.h + 2 * s.kv) + (2 * s.h + lse) + 4 * s.f
            if not s.fused_norm:  # composite RMSNorm keeps the fp32 upcast input and the normalized tensor
                kept += 2 * (4 / b) * s.d_s
        return kept * b
    raise ValueError(f"unknown activation checkpoint mode {mode!r}")


# Under whole-block checkpointing torch's split weight pass (the zero-bubble schedules) calls autograd once per
# parameter group, each call recomputes the checkpointed blocks, and the recomputed activations of the earlier calls
# stay alive: at its peak the pass holds this many times what one block saves without checkpointing, per
# checkpointed block of the stage chunk. Measured with MemTracker on debug blocks (torch 2.13, fp32, dim 512, FFN
# 2048, 4 x 256 and 4 x 512 tokens, 1, 2 and 4 blocks: 5.25, 5.14, 5.24, 5.23 per block; about 0.9 kept per
# group, 9 groups a block, until the sixth group's call returns); tests/test_estimate.py measures it again.
WEIGHT_PASS_RECOMPUTED_PER_BLOCK = 5.25


def weight_pass_grads_per_token(s: BlockShape) -> float:
    """Bytes per token one block keeps between a split backward's input-gradient pass and its weight-gradient pass
    (the zero-bubble pipeline schedules): the gradient flowing into every op on a path to a weight, which torch's
    `stage_backward_input` stores for `stage_backward_weight` (torch 2.13, torch/distributed/pipelining/
    _backward.py, the param groups' "grads"): the outputs of wq, wk, wv and w1, w3 (per TP rank), of wo and w2
    (full width before TP's reduction) and of both norms (the norm weights' products)."""
    return (s.h + 2 * s.kv + 2 * s.f + 2 * s.d + 2 * s.d_s) * s.act_bytes


def backward_working_set_per_token(mode: str, s: BlockShape, compiled: bool) -> float:
    """Bytes alive while ONE block runs backward, beyond what every block keeps: the recomputed activations
    (checkpointed modes) plus the block's gradient buffers (grads of the FFN hidden and of the stream)."""
    b = s.act_bytes
    recomputed = 0.0
    if mode in ("full", "op"):
        recomputed = saved_per_token("none", s, compiled) - saved_per_token(mode, s, compiled)
    grads = (2 * s.f + 3 * s.d) if compiled else (4 * s.f + 4 * s.d)
    return recomputed + grads * b


def recomputed_matmuls(mode: str, stops_early: bool = True) -> tuple[str, ...]:
    """Block matmuls whose forward runs again in backward. A full recompute that stops early (torch's
    non-reentrant checkpoint stops once the last tensor backward saved is rebuilt, before the op that saves it
    runs; a compiled block's partitioner recomputes only what backward reads) never reruns w2: backward needs its
    input, not its output."""
    if mode == "full":
        return MATMUL_ORDER[:-1] if stops_early else MATMUL_ORDER
    if mode == "op":
        return tuple(m for m in MATMUL_ORDER if m not in OP_SAVED_MATMULS)
    return ()


def recomputes_attention(mode: str, op_saves_attention: bool = True) -> bool:
    """Whether backward re-runs the attention forward: "full" always; "op" keeps the attention output unless its
    SDPA op is missing from the save list (torchtitan before PR #2095 with the cuDNN backend)."""
    return mode == "full" or (mode == "op" and not op_saves_attention)


def recomputes_elementwise(mode: str) -> bool:
    return mode in ("full", "op")


def tp_collectives_recomputed(mode: str, stops_early: bool = True) -> int:
    """Sequence-parallel collectives of a block re-run in recompute: full redoes its 2 all-gathers and 2
    reduce-scatters (the second, w2's output, not when the recompute stops early: `recomputed_matmuls`); op
    redoes the 2 all-gathers (the reduce-scatter outputs are saved)."""
    if mode == "full":
        return 3 if stops_early else 4
    return 2 if mode == "op" else 0


def block_modes(ac_mode: str, ac_option: str, n_layers: int) -> list[str]:
    """The mode of each block of a stage (its blocks counted from its first), as apply_ac wraps them."""
    if ac_mode == "none":
        return ["none"] * n_layers
    if ac_mode == "full":
        return ["full"] * n_layers
    if ac_option == "op":
        return ["op"] * n_layers
    every = int(ac_option)
    return ["full" if (i + 1) % every == 0 else "none" for i in range(n_layers)]
