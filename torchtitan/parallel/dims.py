"""ParallelDims: the one place that knows how the world is split.

Every distributed decision in the framework reads this object: the degrees, which are enabled, and the device
mesh built from them. The mesh is laid out (outermost to innermost)

    pp  x  dp_replicate  x  dp_shard  x  cp  x  tp

so that tensor parallelism, which talks every layer, gets the closest ranks (same node), and pipeline stages,
which talk least, are farthest apart. Dimensions of size 1 are still in the mesh, so `mesh["tp"]` always
exists; flattened views serve the consumers that span several dimensions:

    dp          = dp_replicate x dp_shard       ranks that read different data
    dp_shard_cp = dp_shard x cp                 ranks FSDP shards parameters over
    dp_cp       = dp_replicate x dp_shard x cp  ranks the loss is averaged over
    fsdp        = dp_shard_cp, or (dp_replicate, dp_shard_cp) for HSDP
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from torchtitan.errors import UserError

_DIM_NAMES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


def cp_supported(device_type: str) -> bool:
    """Whether torch's context parallel has a ring attention for the SDPA kernel this device type uses.

    Here, not in context.py, because validate() below asks it and context.py builds on ParallelDims.

    CUDA: flash / memory-efficient / cuDNN attention, all handled. CPU: the CPU flash kernel
    (aten._scaled_dot_product_flash_attention_for_cpu) is not in torch's dispatch table as of torch 2.13; this
    asks the table rather than assuming, so a torch that adds it (or a test that registers it) just works.
    """
    if device_type == "cuda":
        return True
    try:
        from torch.distributed.tensor.experimental._context_parallel._attention import custom_ops
    except ImportError:
        return False
    return (
        device_type == "cpu"
        and torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default in custom_ops
    )


@dataclass
class ParallelDims:
    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int
    pp: int
    world_size: int
    _meshes: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        for name in ("dp_replicate", "cp", "tp", "pp"):
            if getattr(self, name) < 1:
                raise UserError(f"parallelism: {name} degree must be >= 1, got {getattr(self, name)}")
        others = self.dp_replicate * self.cp * self.tp * self.pp
        if self.dp_shard == -1:
            if self.world_size % others:
                raise UserError(
                    f"parallelism: world size {self.world_size} is not divisible by dp_replicate {self.dp_replicate}"
                    f" x cp {self.cp} x tp {self.tp} x pp {self.pp} = {others}; data_parallel_shard_degree=-1 needs it"
                )
            self.dp_shard = self.world_size // others
        if self.dp_shard < 1:
            raise UserError(
                f"parallelism: data_parallel_shard_degree must be >= 1 or -1, got {self.dp_shard}"
            )
        product = others * self.dp_shard
        if product != self.world_size:
            raise UserError(
                f"parallelism: dp_replicate {self.dp_replicate} x dp_shard {self.dp_shard} x cp {self.cp} x tp {self.tp}"
                f" x pp {self.pp} = {product}, but the world size is {self.world_size}; make the degrees multiply to"
                f" {self.world_size} (set data_parallel_shard_degree=-1 to fill in the rest)"
            )

    @classmethod
    def from_config(cls, p, world_size: int) -> ParallelDims:
        return cls(
            dp_replicate=p.data_parallel_replicate_degree,
            dp_shard=p.data_parallel_shard_degree,
            cp=p.context_parallel_degree,
            tp=p.tensor_parallel_degree,
            pp=p.pipeline_parallel_degree,
            world_size=world_size,
        )

    @property
    def dp(self) -> int:
        """Ranks that read different data."""
        return self.dp_replicate * self.dp_shard

    @property
    def non_data_parallel_size(self) -> int:
        """Devices that cooperate on one data-parallel rank's batch (tokens/s per device divides by this)."""
        return self.cp * self.tp * self.pp

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def cp_enabled(self) -> bool:
        return self.cp > 1

    @property
    def fsdp_enabled(self) -> bool:
        """Whether parameters are sharded (dp_shard x cp > 1) or replicated (HSDP): FSDP2 is applied."""
        return self.dp_shard * self.cp > 1 or self.dp_replicate > 1

    def global_batch_size(self, training) -> int:
        """Sequences per optimizer step over all dp ranks (training.global_batch_size, -1 = no accumulation)."""
        gbs = training.global_batch_size
        return training.local_batch_size * self.dp if gbs == -1 else gbs

    def grad_accumulation_steps(self, training) -> int:
        """Micro-steps (forward/backward passes) per optimizer step on every rank."""
        return self.global_batch_size(training) // (training.local_batch_size * self.dp)

    def validate(self, model_args, cfg, device_type: str | None = None) -> None:
        """Every constraint between the degrees, the model and the batch, checked before anything is allocated.

        Raises UserError naming the numbers that disagree and a fix. `device_type` ("cpu"/"cuda"), when known,
        adds the checks for features that need a GPU.
        """
        t, p = cfg.training, cfg.parallelism
        if self.tp > 1:
            tp = f"tensor_parallel_degree {self.tp}"
            for name in ("n_heads", "n_kv_heads"):
                n = getattr(model_args, name)
                if n % self.tp:
                    raise UserError(
                        f"parallelism: model {name}={n} is not divisible by {tp} (each rank holds whole heads);"
                        f" use a tensor_parallel_degree that divides {n}"
                    )
            if model_args.ffn_hidden_dim % self.tp:
                raise UserError(
                    f"parallelism: model ffn_hidden_dim={model_args.ffn_hidden_dim} is not divisible by {tp};"
                    f" use a tensor_parallel_degree that divides it"
                )
            if model_args.vocab_size % self.tp:
                raise UserError(
                    f"parallelism: vocab_size={model_args.vocab_size} is not divisible by {tp} (the embedding and,"
                    f" with loss parallel, the logits are sharded over the vocabulary); pad the vocabulary"
                    f" (model.vocab_size) to a multiple of {self.tp} or change the degree"
                )
            if model_args.tie_embeddings:
                raise UserError(
                    f"parallelism: {tp} with tied embeddings (flavor {cfg.model.flavor}) is not supported;"
                    f" set tensor_parallel_degree=1"
                )
            if p.enable_sequence_parallel and t.seq_len % self.tp:
                raise UserError(
                    f"parallelism: training.seq_len={t.seq_len} is not divisible by {tp} (sequence parallel shards"
                    f" the sequence); use a seq_len that is a multiple of {self.tp} or enable_sequence_parallel=false"
                )
        if self.cp > 1:
            if t.seq_len % (2 * self.cp):
                raise UserError(
                    f"parallelism: training.seq_len={t.seq_len} is not divisible by 2 x context_parallel_degree"
                    f" = {2 * self.cp} (each rank takes two chunks for causal load balance); use a multiple of"
                    f" {2 * self.cp}"
                )
            if self.tp > 1 and p.enable_sequence_parallel and (t.seq_len // self.cp) % self.tp:
                raise UserError(
                    f"parallelism: training.seq_len={t.seq_len} / context_parallel_degree {self.cp} ="
                    f" {t.seq_len // self.cp} tokens per cp rank is not divisible by {tp} (sequence parallel);"
                    f" use a seq_len that is a multiple of {2 * self.cp * self.tp}"
                )
            if device_type is not None and not cp_supported(device_type):
                raise UserError(
                    f"parallelism: context_parallel_degree={self.cp}: context parallel needs CUDA (torch's ring"
                    f" attention has no entry for the {device_type} attention kernel); set context_parallel_degree=1"
                )
        micro = t.local_batch_size * self.dp
        gbs = t.global_batch_size
        if gbs != -1 and (gbs < micro or gbs % micro):
            lower = max(micro, gbs - gbs % micro)
            raise UserError(
                f"training.global_batch_size={gbs} is not a multiple of local_batch_size {t.local_batch_size} x dp"
                f" {self.dp} = {micro} (sequences per micro-step); use {lower} or {lower + micro}"
                f" (or -1 for no accumulation)"
            )
        f8 = cfg.float8
        if f8.enable and not f8.emulate:
            # The weight-gradient matmul of a float8 linear contracts over the micro-batch's tokens, and
            # torch._scaled_mm needs every contracted dimension divisible by 16. Those tokens are the
            # (pipeline) micro-batch's sequences x seq_len / cp; sequence parallel does not split them (the
            # TP linears all-gather the sequence first).
            mbs = p.pipeline_parallel_microbatch_size if self.pp > 1 else t.local_batch_size
            tokens = mbs * t.seq_len // self.cp
            if tokens % 16:
                batch = (
                    "parallelism.pipeline_parallel_microbatch_size"
                    if self.pp > 1
                    else "training.local_batch_size"
                )
                split = f" / context_parallel_degree {self.cp}" if self.cp > 1 else ""
                raise UserError(
                    f"float8: {batch}={mbs} x training.seq_len={t.seq_len}{split} = {tokens} tokens per micro-batch"
                    f" and rank is not divisible by 16, which float8 matmuls (torch._scaled_mm) need; make"
                    f" {batch} x seq_len a multiple of {16 * self.cp} (or set float8.enable=false)"
                )
        if p.fsdp_cpu_offload and device_type == "cpu":
            raise UserError(
                "parallelism.fsdp_cpu_offload=true needs CUDA (on CPU everything already lives in CPU memory);"
                " set it to false"
            )

    def build_mesh(self, device_type: str):
        from torch.distributed.device_mesh import init_device_mesh

        shape = tuple(getattr(self, name) for name in _DIM_NAMES)
        mesh = init_device_mesh(device_type, shape, mesh_dim_names=_DIM_NAMES)
        # torch asks callers to keep flattened meshes themselves rather than slice them out of the root again.
        self._meshes = {"world": mesh, **{name: mesh[name] for name in _DIM_NAMES}}
        self._meshes["dp"] = mesh["dp_replicate", "dp_shard"]._flatten("dp")
        self._meshes["dp_shard_cp"] = mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
        self._meshes["dp_cp"] = mesh["dp_replicate", "dp_shard", "cp"]._flatten("dp_cp")
        # FSDP shards over dp_shard x cp; with HSDP it also replicates over dp_replicate (a 2-D mesh).
        if self.dp_replicate == 1:
            self._meshes["fsdp"] = self._meshes["dp_shard_cp"]
        elif self.cp == 1:
            self._meshes["fsdp"] = mesh["dp_replicate", "dp_shard"]
        else:
            self._meshes["fsdp"] = mesh["dp_replicate", "dp_shard_cp"]
        return mesh

    def mesh(self, name: str = "world"):
        """The device mesh over one dimension ("tp", "dp", "dp_shard_cp", ...) or the whole "world"."""
        if not self._meshes:
            raise RuntimeError("ParallelDims.build_mesh() must be called first")
        return self._meshes[name]

    def describe(self) -> str:
        return (
            f"world {self.world_size} = pp {self.pp} x dp_replicate {self.dp_replicate} x dp_shard {self.dp_shard}"
            f" x cp {self.cp} x tp {self.tp}"
        )
