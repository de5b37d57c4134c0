"""The run's configuration: one dataclass per TOML section.

Every field has a default and a one-line help text (shown by `--help`). The types are the contract the parser
enforces: int, float, str, bool, a Literal of allowed strings, `X | None`, or `list[X]`.
Fields that a later feature needs live here too, so the file format stays stable as the framework grows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


def opt(default, help: str):
    """A config field: its default and its one-line help text."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class Job:
    config_file: str | None = opt(None, "TOML file to load; CLI overrides take precedence over it")
    dump_folder: str = opt(
        "./outputs", "root folder for everything a run writes (config, logs, tb, checkpoints)"
    )
    description: str = opt("", "free-text description printed in the run header")
    print_config: bool = opt(True, "print the effective config at start (rank 0)")
    dry_run: bool = opt(
        False,
        "check the launch (config, mesh, tokenizer, data, folders, rendezvous) and exit without training",
    )
    expected_nodes: int | None = opt(
        None, "fail at start unless the launcher formed a world of exactly this many nodes (None = no check)"
    )


@dataclass
class Model:
    name: str = opt("llama3", "model family (registry key in torchtitan.models)")
    flavor: str = opt(
        "debugmodel",
        "model size: debugmodel, debugmodel_large, 1B, 3B, 8B, 70B, 405B, or custom (shape from the fields below)",
    )
    tokenizer_path: str = opt(
        "tests/assets/tokenizer/debug.model",
        "tokenizer file or folder: sentencepiece .model, tiktoken BPE file (Llama 3 original/tokenizer.model),"
        " HF tokenizer.json (+ tokenizer_config.json)",
    )
    vocab_size: int | None = opt(None, "override the flavor's vocabulary size (must equal the tokenizer's)")
    max_seq_len: int | None = opt(None, "override the RoPE table length (defaults to the flavor's)")
    # Shape fields: each overrides the flavor's value; with flavor = "custom" they describe the whole model
    # (dim, n_layers, n_heads and vocab_size required), for training and for the estimator alike.
    dim: int | None = opt(None, "model width (hidden size); None = the flavor's")
    n_layers: int | None = opt(None, "number of transformer blocks; None = the flavor's")
    n_heads: int | None = opt(
        None, "attention (query) heads; dim must be divisible by it; None = the flavor's"
    )
    n_kv_heads: int | None = opt(
        None,
        "key/value heads (grouped-query attention; = n_heads for none); None = the flavor's (custom: n_heads)",
    )
    ffn_hidden_dim: int | None = opt(
        None,
        "SwiGLU hidden size, exact (e.g. 11008 for Llama 2 7B); None = from ffn_dim_multiplier and multiple_of",
    )
    ffn_dim_multiplier: float | None = opt(
        None, "scales Meta's 8/3*dim FFN rule before rounding up to multiple_of; None = the flavor's"
    )
    multiple_of: int | None = opt(
        None, "the FFN hidden size is rounded up to a multiple of this; None = the flavor's"
    )
    norm_eps: float | None = opt(None, "RMSNorm epsilon; None = the flavor's")
    rope_theta: float | None = opt(
        None, "RoPE base frequency (Llama 2: 10000, Llama 3: 500000); None = the flavor's"
    )
    rope_scaling_factor: float | None = opt(
        None,
        "Llama 3.1 RoPE scaling factor (8 for 8B/70B/405B); 1.0 = no scaling; None = the flavor's",
    )
    rope_low_freq_factor: float | None = opt(None, "Llama 3.1 RoPE scaling low_freq_factor; None = 1.0")
    rope_high_freq_factor: float | None = opt(None, "Llama 3.1 RoPE scaling high_freq_factor; None = 4.0")
    rope_original_max_position_embeddings: int | None = opt(
        None, "Llama 3.1 RoPE scaling original context length; None = 8192"
    )
    tie_embeddings: bool | None = opt(
        None, "output projection reuses the embedding table (Llama 3.2 1B/3B); None = the flavor's"
    )


@dataclass
class Training:
    local_batch_size: int = opt(8, "sequences per data-parallel rank per micro-step (forward/backward)")
    global_batch_size: int = opt(
        -1,
        "sequences per optimizer step over all dp ranks; more than local_batch_size x dp accumulates"
        " gradients over micro-steps; -1 = local_batch_size x dp (no accumulation)",
    )
    seq_len: int = opt(2048, "tokens per sequence")
    steps: int = opt(1000, "number of optimizer steps to train")
    seed: int = opt(0, "seed for weight init and RNG; the same seed gives the same weights in any layout")
    deterministic: bool = opt(
        False, "use deterministic algorithms (slower; for debugging); sets CUBLAS_WORKSPACE_CONFIG unless set"
    )
    max_norm: float = opt(1.0, "clip gradients to this global L2 norm (<= 0 disables clipping)")
    mixed_precision_param: Literal["bfloat16", "float32"] = opt(
        "bfloat16",
        "compute dtype of forward/backward; parameters stay fp32 (FSDP2 MixedPrecisionPolicy with data"
        " parallelism, torch.autocast with one data-parallel rank)",
    )
    mixed_precision_reduce: Literal["float32", "bfloat16"] = opt(
        "float32", "dtype of the data-parallel gradient reduction (FSDP2; unused with one data-parallel rank)"
    )
    cpu_bf16_fp32_kernels: bool = opt(
        True,
        "bf16 on a CPU without bf16 instructions (no AVX512-BF16/AMX): run matmuls and attention in fp32 kernels"
        " on operands rounded to bf16, results rounded to bf16 (2-5x faster there than torch's bf16 kernels;"
        " docs/parallelism.md); generation too, with oneDNN's bf16 matmul for decode steps' few rows"
        " (docs/generate.md); ignored on GPUs and CPUs with bf16 instructions",
    )
    gc_freq: int = opt(
        50, "run Python garbage collection every N steps (automatic GC is disabled); 0 = leave GC on"
    )
    skip_nonfinite_steps: bool = opt(
        False,
        "on a NaN/inf loss or grad norm skip the optimizer step (grads zeroed) instead of stopping; costs a"
        " host-device sync and a tiny all-reduce every step (else NaN/inf is checked on log and checkpoint steps)",
    )


@dataclass
class Parallelism:
    data_parallel_replicate_degree: int = opt(1, "HSDP replicas (1 = plain FSDP)")
    data_parallel_shard_degree: int = opt(-1, "FSDP shard degree; -1 = whatever the other degrees leave")
    tensor_parallel_degree: int = opt(1, "tensor parallel degree")
    pipeline_parallel_degree: int = opt(1, "pipeline parallel degree")
    context_parallel_degree: int = opt(
        1, "context parallel degree: each sequence split over this many ranks (ring attention; CUDA only)"
    )
    context_parallel_rotate_method: Literal["allgather", "alltoall"] = opt(
        "allgather", "how context parallel passes key/value shards between ranks (torch's set_rotate_method)"
    )
    pipeline_parallel_schedule: Literal[
        "GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble"
    ] = opt("1F1B", "pipeline schedule; the interleaved ones need pipeline_parallel_stages_per_rank >= 2")
    pipeline_parallel_stages_per_rank: int = opt(
        1, "pipeline stages on each pp rank (1 for GPipe/1F1B, >= 2 interleaved, exactly 2 for ZBVZeroBubble)"
    )
    pipeline_parallel_split_points: list[str] = opt(
        [], "layers that start a new stage, e.g. ['layers.2', 'layers.4']; empty = split layers evenly"
    )
    pipeline_parallel_microbatch_size: int = opt(
        1, "sequences per pipeline micro-batch; micro-batches = local_batch_size / this"
    )
    fsdp_reshard_after_forward: Literal["default", "always", "never"] = opt(
        "default",
        "free gathered parameters after forward: default = embedding and blocks yes, head and root no (never"
        " with PP or when nothing is sharded)",
    )
    fsdp_cpu_offload: bool = opt(
        False,
        "keep parameters, gradients and optimizer state in CPU memory (FSDP2 CPUOffloadPolicy; CUDA only)",
    )
    enable_sequence_parallel: bool = opt(
        True, "with tensor parallel: shard norms and the residual stream on the sequence dimension"
    )
    enable_loss_parallel: bool = opt(
        True, "with tensor parallel: keep logits sharded on the vocabulary into the cross-entropy"
    )


@dataclass
class Optimizer:
    name: Literal["AdamW"] = opt("AdamW", "optimizer")
    lr: float = opt(8e-4, "peak learning rate")
    beta1: float = opt(0.9, "Adam beta1")
    beta2: float = opt(0.95, "Adam beta2")
    eps: float = opt(1e-8, "Adam epsilon")
    weight_decay: float = opt(
        0.1, "decoupled weight decay (applied to matrices only, not norms or embeddings)"
    )
    implementation: Literal["foreach", "fused", "for-loop"] = opt(
        "fused",
        "AdamW kernel: fused (one kernel per step, CPU and CUDA), foreach (multi-tensor ops) or for-loop",
    )


@dataclass
class LRScheduler:
    warmup_steps: int = opt(200, "linear warmup steps from near 0 to optimizer.lr")
    decay_ratio: float | None = opt(
        None,
        "fraction of steps spent decaying at the end (warmup-stable-decay); None = decay right after warmup",
    )
    decay_type: Literal["linear", "cosine"] = opt("linear", "shape of the decay")
    min_lr_factor: float = opt(0.0, "floor of the decay as a fraction of optimizer.lr")


@dataclass
class Data:
    dataset: str = opt(
        "debug_corpus", "built-in source: debug_corpus (offline, shipped) or c4 (HF hub, streaming)"
    )
    dataset_path: str | None = opt(
        None, "local .json/.jsonl/.parquet/.txt file, glob or folder (overrides the source's path)"
    )
    text_field: str = opt("text", "name of the text column in the dataset")
    num_shards: int | None = opt(
        None,
        "split the documents into this many virtual shards (a multiple of the dp degree) so the global batch "
        "and resume do not depend on the dp degree; None = one per dp rank (cheapest)",
    )


@dataclass
class Checkpoint:
    enable: bool = opt(False, "save and resume checkpoints")
    folder: str = opt("checkpoint", "checkpoint folder, relative to job.dump_folder")
    interval: int = opt(500, "save every N steps (and always at the last step)")
    keep_latest_k: int = opt(
        0, "keep only the newest K committed checkpoints (older ones are deleted after a save); 0 = keep all"
    )
    load_step: int = opt(-1, "step to resume from: -1 = the latest committed checkpoint in the folder")
    verify_on_load: bool = opt(
        True,
        "before loading, check every file's content checksum against the checkpoint's marker (one extra read"
        " of the checkpoint, shared out over the ranks); a mismatch stops the run naming the file",
    )
    async_mode: Literal["disabled", "async"] = opt(
        "disabled",
        "async: write checkpoints in a background thread while training continues (dcp.async_save)",
    )
    last_save_model_only: bool = opt(
        False, "at the last step save only the model weights (in export_dtype) instead of a full checkpoint"
    )
    export_dtype: Literal["float32", "bfloat16"] = opt("float32", "dtype of model-only exports")
    initial_load_path: str | None = opt(
        None, "DCP folder to start from when the checkpoint folder has none (e.g. converted HF weights)"
    )
    initial_load_model_only: bool = opt(
        True, "load only the model weights from initial_load_path (fresh optimizer, step 0)"
    )
    create_seed_checkpoint: bool = opt(
        False, "write the initial weights as <folder>/step-0 and exit (other layouts can start from them)"
    )


@dataclass
class ActivationCheckpoint:
    mode: Literal["none", "full", "selective"] = opt(
        "none", "activation checkpointing: none, full (recompute every block) or selective (see option)"
    )
    selective_ac_option: str = opt(
        "op",
        "selective mode: 'op' = save matmul/attention outputs, recompute the rest; an integer N as a string"
        " ('2') = checkpoint every N-th block fully",
    )


@dataclass
class Float8:
    enable: bool = opt(False, "train linear layers in float8 through torchao (converted before TP and FSDP)")
    recipe: Literal["tensorwise", "rowwise"] = opt(
        "tensorwise", "torchao scaling recipe: tensorwise (one scale per tensor) or rowwise (one per row)"
    )
    enable_fsdp_float8_all_gather: bool = opt(
        False, "FSDP2 all-gathers float8 weights (half the bytes of bf16); tensorwise recipe only"
    )
    precompute_float8_dynamic_scale_for_fsdp: bool = opt(
        False, "compute all weight scales in one all-reduce after the optimizer step (needs the all-gather)"
    )
    min_dim: int = opt(
        1024, "skip linear layers whose in or out features are below this (too small to gain from float8)"
    )
    emulate: bool = opt(
        False, "emulate float8 matmuls in high precision (for devices without float8 matmul support)"
    )


@dataclass
class Compile:
    enable: bool = opt(False, "torch.compile each transformer block (and the loss, see components)")
    components: list[Literal["model", "loss"]] = opt(
        ["model", "loss"], "what to compile when enabled: model (each block) and/or loss"
    )


@dataclass
class Metrics:
    log_freq: int = opt(
        10,
        "log metrics every N steps (and at step 1 and the last step); NaN/inf and preemption signals are"
        " checked on these steps and checkpoint steps",
    )
    enable_tensorboard: bool = opt(True, "write TensorBoard event files under <dump_folder>/tb")
    enable_jsonl: bool = opt(True, "write the same numbers to <dump_folder>/metrics.jsonl")
    peak_tflops: float | None = opt(
        None, "peak dense TFLOPS of one device for MFU; None = table, else measured"
    )
    causal_flops: bool = opt(
        False, "count attention FLOPs halved for the causal mask (default: full, as Megatron/torchtitan)"
    )
    straggler_factor: float = opt(
        1.2,
        "warn when the slowest rank's step time (or its data wait) exceeds the median step time this many times",
    )
    enable_wandb: bool = opt(
        False, "also log to Weights & Biases (pip install wandb; WANDB_MODE=offline works without network)"
    )
    wandb_project: str = opt("torchtitan", "W&B project name")
    wandb_every_rank: bool = opt(
        False,
        "W&B: one run per rank (grouped) instead of rank 0 only; each shows its own step time and memory",
    )


@dataclass
class Profiling:
    enable_profiling: bool = opt(False, "record torch.profiler traces")
    save_traces_folder: str = opt("profile_traces", "trace folder, relative to job.dump_folder")
    profile_freq: int = opt(10, "record one step every N steps")
    memory_snapshot_steps: list[int] = opt(
        [],
        "steps whose memory is recorded per rank: CUDA allocator history + snapshot (pytorch.org/memory_viz),"
        " on CPU the profiler's memory timeline",
    )
    memory_snapshot_folder: str = opt(
        "memory_snapshots",
        "memory snapshot folder (also for out-of-memory dumps), relative to job.dump_folder",
    )
    record_memory_history: bool = opt(
        False,
        "CUDA: record allocator history for the whole run, so an out-of-memory snapshot has stack traces"
        " (costs host time per allocation)",
    )


@dataclass
class Validation:
    enable: bool = opt(False, "compute the loss on held-out data every `freq` steps and at the last step")
    freq: int = opt(500, "validate every N steps (and at the last step)")
    steps: int = opt(
        10, "number of validation batches: the same global batches every time and in every parallel layout"
    )
    global_batch_size: int = opt(
        -1,
        "sequences per validation batch over all dp ranks (a multiple of local_batch_size x dp); -1 = the"
        " training global batch; fix it to compare layouts whose training global batch differs",
    )
    dataset: str | None = opt(None, "built-in source of the held-out data; None = data.dataset")
    dataset_path: str | None = opt(
        None, "local held-out files (needed when data.dataset_path is set: training files are not held out)"
    )
    split: str = opt("validation", "split of the built-in source (debug_corpus: validation; c4: validation)")


@dataclass
class Comm:
    init_timeout_seconds: int = opt(
        300,
        "timeout for process-group init, checkpoint load and every collective of the first step (all groups)",
    )
    train_timeout_seconds: int = opt(
        100, "timeout for each collective on every process group once the first step has completed"
    )
    watchdog_timeout_seconds: int = opt(
        1800,
        "dump all stacks and exit (code 3) if no step completes in this time; the first step also gets"
        " comm.init_timeout_seconds; 0 = off",
    )
    mode: Literal["default", "fake_backend"] = opt(
        "default",
        "fake_backend: simulate one rank of a fake_world_size-rank job in this one process (no torchrun) over"
        " torch's fake process group: real mesh, shards, compute and memory; collectives move no data, so loss"
        " values are meaningless, batches are random tokens and checkpoint saving is refused (docs/launching.md)",
    )
    fake_world_size: int = opt(
        0, "comm.mode=fake_backend: the world size to simulate (the parallel degrees must multiply to it)"
    )
    fake_rank: int = opt(0, "comm.mode=fake_backend: the rank this process plays, 0 .. fake_world_size-1")


@dataclass
class Estimate:
    """Read by `python -m torchtitan.estimate` only (docs/estimate.md); training ignores this section."""

    mode: Literal["training", "inference"] = opt(
        "training", "what to estimate: a training step, or generation (prefill + decode)"
    )
    hardware: str = opt(
        "h100-sxm",
        "device to plan for: a100, a100-40gb, a800, h100-sxm, h100-pcie, h100-nvl, h200, h200-nvl, h800, gh200"
        " (96 GB), gh200-144gb, b200, gb200, b300, gb300, l40s, mi300x, mi325x, mi355x, cpu (cpu: peak and bandwidths"
        " measured here)",
    )
    num_devices: int = opt(8, "devices (ranks) of the planned run; the parallel degrees must multiply to it")
    devices_per_node: int | None = opt(
        None,
        "devices sharing a node's fabric; None = the hardware's (8 for GPUs, 4 for GH200 nodes, 72 for a GB200 / GB300"
        " NVL72 rack)",
    )
    total_tokens: float | None = opt(
        None, "training tokens of the whole run, for gpu_hours and days (e.g. 15e12)"
    )
    goodput_percent: float = opt(
        100.0,
        "expected goodput/percent of the run (docs/metrics.md, 'Goodput': productive steps over the wall clock,"
        " restarts and saves included); gpu_hours and days are the productive time divided by it",
    )
    json: str | None = opt(None, "also write the estimate as JSON to this file")
    anchor: str | None = opt(
        None,
        "a run measured on the hardware planned: a run folder of this trainer (its config.toml, metrics.jsonl,"
        " logs/rank0.log) or a torchtitan log of rank 0 (its console output); the step time is scaled by that"
        " run's measured / estimated tokens/s (best from a run of the same model, compile mode and layout kind;"
        " docs/estimate.md, 'Anchoring on a measured run'), and the peak memory beyond weights, gradients and"
        " optimizer states by its measured / estimated part when the run also has the plan's activation"
        " checkpointing and no pipeline; training, GPU plans",
    )
    anchor_config: str | None = opt(
        None,
        "with a torchtitan log as estimate.anchor: the config file its run used (torchtitan's TOML or ours);"
        " default the plan's own config. The layout, batch, compile, activation checkpointing and float8 the log"
        " states override it, and a log dated after torchtitan#1580 (2025-08) sets estimate.ac_early_stop=false",
    )
    accuracy: bool = opt(
        True,
        "also report how far the estimates of comparable published runs (same device family and layout kind, from"
        " the validation table; it says when none ran on the planned part itself) were from their figures, the range"
        " an 80 % interval of those errors puts this plan's figures in, and how many of those errors would turn the"
        " plan's FITS over (a search: for each layout shown, the 'at risk' column); about a second",
    )
    search: bool = opt(
        False,
        "rank every layout (FSDP/HSDP/TP/PP/CP degrees, AC mode, local batch) that fits num_devices, fastest first",
    )
    search_top: int = opt(10, "layouts shown by search")
    calibrate: bool = opt(
        False,
        "measure matmul, attention, memory-bandwidth, eager-loss and collective micro-benchmarks on the devices present"
        " (CPU: gloo between 2 processes), and an eager run's block and head beside their own kernels, and use them"
        " instead of the table and default efficiencies; on a CPU whose cores hold the planned world, also time the"
        " trainer's own step and its peak memory on the plan cut to 1 and up to 3 blocks per stage (twice each), whose"
        " lines set the step time and (without PP) the memory; in inference mode instead the GEMM peak, the bandwidth,"
        " the decode step's matmuls and (without TP) the generator's own prefill and decode step at 1 and up to 3 blocks",
    )
    async_tp: bool = opt(
        False,
        "what-if: tensor-parallel collectives overlapped as by torch's async TP (not applied by this trainer yet)",
    )
    eager_rms_norm: Literal["fused", "composite"] = opt(
        "fused",
        "RMSNorm outside torch.compile on CUDA: fused (one kernel each way: torch >= 2.9, or a framework's own"
        " fused kernel) or composite (upcast,"
        " square, mean, rsqrt, scale, downcast, weight as separate kernels: torch before 2.9, for runs on older"
        " software); CPU is always composite",
    )
    pp_outputs: Literal["released", "kept"] = opt(
        "released",
        "the last pipeline stage's per-micro-batch outputs: released (this trainer: step(return_outputs=False) on"
        " torch >= 2.10) or kept until step() returns them merged (torch before pytorch/pytorch#165822, Oct 2025,"
        " for runs on older software)",
    )
    attention_backend: Literal["auto", "flash", "cudnn"] = opt(
        "auto",
        "the SDPA kernel a run uses: auto = what torch >= 2.11 picks with the cuDNN its wheel bundles (9.19 > 9.15:"
        " cuDNN on Hopper and Blackwell, FlashAttention-2 elsewhere); flash = FlashAttention-2 (torch's choice on Hopper"
        " before 2.9, for runs on older software); cudnn = cuDNN attention",
    )
    ac_early_stop: bool = opt(
        True,
        "a fully checkpointed block's recompute stops once the tensors its backward needs are rebuilt, so its last"
        " matmul (w2) and that matmul's TP collective never run again (this trainer: torch's non-reentrant"
        " checkpoint with early stop; compiled blocks always, the partitioner keeping only what backward reads);"
        " false: the whole block is recomputed (reentrant checkpointing, or torchtitan from its PR #1580, 2025-08,"
        " whose activation_checkpoint.early_stop defaults to false): for runs on that software",
    )
    sac_saves_attention: bool = opt(
        True,
        "selective op AC keeps SDPA's output (this trainer's save list names every SDPA backend); false: attention"
        " is recomputed in backward, as torchtitan before its PR #2095 (2025-12) did with cuDNN attention, which it"
        " put first on B200 (PR #1196): for runs on that software",
    )
    float8_weights: Literal["recast", "saved"] = opt(
        "recast",
        "how backward gets a float8 linear's float8 weight: recast from the weight (this trainer: torch's"
        " partitioner treats parameters as free to save since pytorch/pytorch#148922, 2025-03) or saved from the"
        " forward, the unsharded float8 weight of every block not checkpointed held until its backward (torchao's"
        " Float8Linear without force_recompute_fp8_weight_in_bwd on torch before that fix, e.g. torchtitan before"
        " its PR #833, 2025-02: for runs on that software)",
    )
    peak_tflops: float | None = opt(
        None, "override the device's dense BF16 peak TFLOPS (e.g. a power-capped part)"
    )
    fp8_peak_tflops: float | None = opt(
        None, "override the dense FP8 peak TFLOPS (None: 2x peak_tflops on FP8 parts)"
    )
    power_limit_w: float | None = opt(
        None, "the parts' power limit in W when below their TDP (torchtitan's H100s: 500); slows compute"
    )
    sm_clock_mhz: float | None = opt(
        None,
        "the SM clock in MHz when locked below boost (nvidia-smi -lgc, as benchmarks do): compute runs at its"
        " unthrottled rate x clock / boost where that is below the power limit's rate; H100 SXM, H200 (boost"
        " 1980) and B200 (1965)",
    )
    memory_gib: float | None = opt(
        None, "override device memory in GiB (96 GB H100: 95.04, what torch reports)"
    )
    hbm_bandwidth_gbps: float | None = opt(None, "override device memory bandwidth, GB/s")
    intra_node_bandwidth_gbps: float | None = opt(
        None, "override per-device intra-node bandwidth, GB/s per direction"
    )
    inter_node_bandwidth_gbps: float | None = opt(
        None, "override per-device inter-node bandwidth, GB/s per direction"
    )
    intra_node_topology: Literal["auto", "switch", "mesh"] = opt(
        "auto",
        "how a node's GPUs are linked: switch (NVSwitch: any GPU reaches any other at its full NVLink bandwidth),"
        " mesh (each GPU linked straight to each peer, no switch: a ring over k of a node's n GPUs has (k-1)/(n-1)"
        " of the node's bandwidth and a send to one peer 1/(n-1); 4-GPU HGX H100 / H200 boards, 6 NVLinks a pair);"
        " auto = the device's own node (mesh for MI300X, MI325X, MI355X and GH200 nodes and for 4 H100 / H200 SXM"
        " GPUs a node, a 4-GPU HGX board; switch elsewhere)",
    )
    inter_node_busbw_gbps: float | None = opt(
        None,
        "the bus bandwidth your cluster measured for a large collective over the job's nodes, every GPU of each"
        " node in it (nccl-tests' busbw: all_gather_perf for FSDP, all_reduce_perf for DDP), GB/s; replaces the"
        " rail model (GPUs per node x NIC rate x 0.96) for collectives that cross nodes",
    )
    dp_grad_sync: Literal["micro_step", "step"] = opt(
        "micro_step",
        "when data parallelism reduces gradients under accumulation: every micro-step (this trainer) or once per"
        " optimizer step after the last (no_sync: DDP's as nanotron and Megatron-LM's DDP run it, FSDP2's"
        " set_requires_gradient_sync(False) or FSDP1's no_sync, which keep the unsharded gradients in the reduce"
        " dtype until then: for runs of that software; not with pipeline parallelism)",
    )
    grad_accumulator: Literal["none", "fp32"] = opt(
        "none",
        "where each micro-step's gradients go: none (autograd's own .grad, this trainer) or fp32 = added into an fp32"
        " buffer of the rank's parameters by one kernel per parameter after every backward, 10 bytes a parameter"
        " (nanotron's FP32GradientAccumulator, accumulate_grad_in_fp32: for runs of that software)",
    )
    eager_loss: Literal["torch", "sharded_fp32", "bf16"] = opt(
        "torch",
        "the cross-entropy outside torch.compile: torch (this trainer: F.cross_entropy on the upcast logits),"
        " sharded_fp32 = logits cast to fp32, then max, subtract, exp, sum and divide as separate passes, the fp32"
        " softmax saved for backward (nanotron's sharded_cross_entropy: for runs of that software), or bf16 ="
        " F.cross_entropy on the bf16 logits as they come, no upcast (a Hugging Face LlamaForCausalLM called"
        " without labels, transformers 4.51-4.52, its loss taken by the script: for runs of that software)",
    )
    swiglu: Literal["separate", "split"] = opt(
        "separate",
        "SwiGLU's inputs outside torch.compile: separate (this trainer: w1 and w3 as two linears, contiguous"
        " outputs) or split = one fused gate/up linear whose output is split into two strided halves before"
        " SiLU and the product, which run at the strided rate torch's eager kernels measured (nanotron's"
        " GLUActivation: for runs of that software)",
    )
    tp_embedding: Literal["sharded", "replicated"] = opt(
        "sharded",
        "the token embedding under tensor parallelism: sharded (this trainer: rowwise over the TP ranks) or replicated"
        " = the whole table on every TP rank, its output sliced for sequence parallelism (KempnerForge's TP plan:"
        " for runs of that software)",
    )
    tp_head: Literal["sharded", "replicated"] = opt(
        "sharded",
        "the output projection under tensor parallelism: sharded (this trainer: column-wise over the TP ranks, its"
        " logits gathered without loss parallel) or replicated = the whole projection on every TP rank, no TP"
        " collective for it (KempnerForge's plan on its pipeline stages: for runs of that software)",
    )
    tp_inputs: Literal["module", "linear"] = opt(
        "module",
        "where a TP plan redistributes the attention's and the MLP's input: module (this trainer and torchtitan:"
        " PrepareModuleInput, one collective for wq, wk, wv and one for w1, w3) or linear = each column-wise linear"
        " redistributes its own input (KempnerForge's plan: for runs of that software), so the backward reduces 5"
        " input gradients a block instead of 2, and under sequence parallelism an eager forward all-gathers 5 times"
        " (torch.compile's CSE merges those to 2)",
    )
    model_dtype: Literal["trainer", "bfloat16"] = opt(
        "trainer",
        "the dtype parameters, gradients and optimizer states are kept in: trainer (fp32, bf16 compute by FSDP2's"
        " mixed precision or autocast) or bfloat16 = a model built and stepped in bf16 throughout, no fp32 copy and"
        " no casts (scripts that build a Hugging Face model in bf16, or frameworks that cast the model to bf16"
        " before FSDP2 as KempnerForge does: for runs of that software; not with CPU offload)",
    )
    optimizer: Literal["trainer", "sgd"] = opt(
        "trainer",
        "the optimizer step: trainer (AdamW by --optimizer.implementation, then the gradient norm) or sgd ="
        " torch.optim.SGD without momentum and no gradient norm: one update reading each parameter and gradient"
        " and writing the parameter, no state (scripts that step that way: for runs of that software)",
    )
    batch_size: int = opt(1, "inference: sequences generated together")
    prompt_len: int = opt(128, "inference: prompt tokens per sequence (prefill)")
    gen_len: int = opt(256, "inference: generated tokens per sequence (decode)")
    weight_dtype: Literal["bfloat16", "int8", "int4"] = opt(
        "bfloat16", "inference: weight precision of the linear layers (weight-only int8 / int4 with group 32)"
    )


@dataclass
class JobConfig:
    job: Job = field(default_factory=Job)
    model: Model = field(default_factory=Model)
    training: Training = field(default_factory=Training)
    parallelism: Parallelism = field(default_factory=Parallelism)
    optimizer: Optimizer = field(default_factory=Optimizer)
    lr_scheduler: LRScheduler = field(default_factory=LRScheduler)
    data: Data = field(default_factory=Data)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    activation_checkpoint: ActivationCheckpoint = field(default_factory=ActivationCheckpoint)
    float8: Float8 = field(default_factory=Float8)
    compile: Compile = field(default_factory=Compile)
    metrics: Metrics = field(default_factory=Metrics)
    profiling: Profiling = field(default_factory=Profiling)
    validation: Validation = field(default_factory=Validation)
    comm: Comm = field(default_factory=Comm)
    estimate: Estimate = field(default_factory=Estimate)
