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
    flavor: str = opt("debugmodel", "model size: debugmodel, 1B, 3B, 8B, 70B, 405B")
    tokenizer_path: str = opt(
        "tests/assets/tokenizer/debug.model", "sentencepiece .model or HF tokenizer.json"
    )
    vocab_size: int | None = opt(None, "override the flavor's vocabulary size (must equal the tokenizer's)")
    max_seq_len: int | None = opt(None, "override the RoPE table length (defaults to the flavor's)")


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
    deterministic: bool = opt(False, "use deterministic algorithms (slower; for debugging)")
    max_norm: float = opt(1.0, "clip gradients to this global L2 norm (<= 0 disables clipping)")
    mixed_precision_param: Literal["bfloat16", "float32"] = opt(
        "bfloat16", "dtype of parameters during forward/backward (FSDP2 MixedPrecisionPolicy)"
    )
    mixed_precision_reduce: Literal["float32", "bfloat16"] = opt("float32", "dtype of the gradient reduction")
    gc_freq: int = opt(
        50, "run Python garbage collection every N steps (automatic GC is disabled); 0 = leave GC on"
    )
    skip_nonfinite_steps: bool = opt(
        False, "on a NaN/inf loss or grad norm skip the optimizer step (grads zeroed) instead of stopping"
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
        "free gathered parameters after forward: default = blocks yes, root no (never with PP or an unsharded mesh)",
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
    implementation: Literal["foreach", "fused", "for-loop"] = opt("foreach", "AdamW kernel implementation")


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
    log_freq: int = opt(10, "log metrics every N steps (and at step 1 and the last step)")
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
    init_timeout_seconds: int = opt(300, "timeout for process-group init and the first collectives")
    train_timeout_seconds: int = opt(100, "timeout for collectives during training steps")
    watchdog_timeout_seconds: int = opt(
        1800,
        "dump all stacks and exit (code 3) if no step completes in this time; the first step also gets"
        " comm.init_timeout_seconds; 0 = off",
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
