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

from torchtitan.errors import UserError

_DIM_NAMES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


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
