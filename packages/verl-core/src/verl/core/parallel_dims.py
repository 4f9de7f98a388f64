"""How a world of ranks is split into parallel dimensions, and the device mesh that names them.

One object for every engine (torchtitan's ``ParallelDims`` is the model): data parallelism, split into
replicas (``dp_replicate``) and FSDP shards within a replica (``dp_shard``), tensor (``tp``), pipeline
(``pp``), context/sequence (``cp``: Ulysses or ring attention) and expert (``ep``) parallelism. An engine
takes its process groups from :meth:`ParallelDims.build_mesh` by name, so a new parallelism adds a
dimension here rather than a new way to build groups.

Ranks are laid out ``pp`` outermost, then ``dp_replicate``, ``dp_shard``, ``cp``, ``tp`` innermost (tensor
parallel peers are neighbours, on one node where possible). Expert parallelism borrows ranks from
``dp_shard x cp`` (the experts of one layer are spread over data-parallel ranks), so it is not a mesh
dimension of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Mesh dimension names, outermost first.
MESH_ORDER = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


class ParallelLayoutError(ValueError):
    """The world size cannot be split as asked; the message names the sizes and what to change."""


@dataclass(frozen=True)
class ParallelDims:
    world_size: int
    dp_replicate: int = 1
    #: FSDP shard degree; -1: every rank the other dimensions leave.
    dp_shard: int = -1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        for name in ("world_size", "dp_replicate", "tp", "pp", "cp", "ep"):
            if getattr(self, name) < 1:
                raise ParallelLayoutError(f"{name}={getattr(self, name)} must be at least 1")
        others = self.dp_replicate * self.tp * self.pp * self.cp
        if self.dp_shard == -1:
            if self.world_size % others:
                raise ParallelLayoutError(
                    f"{self.world_size} ranks cannot be split into dp_replicate={self.dp_replicate} x tp={self.tp} "
                    f"x pp={self.pp} x cp={self.cp} (= {others}) times a whole number of FSDP shards; make their "
                    f"product divide {self.world_size}"
                )
            object.__setattr__(self, "dp_shard", self.world_size // others)
        if self.dp_shard < 1 or others * self.dp_shard != self.world_size:
            raise ParallelLayoutError(
                f"dp_replicate={self.dp_replicate} x dp_shard={self.dp_shard} x tp={self.tp} x pp={self.pp} x "
                f"cp={self.cp} = {others * max(self.dp_shard, 0)} ranks, but there are {self.world_size}; the "
                "product must equal the number of ranks (dp_shard=-1 takes whatever the others leave)"
            )
        if (self.dp_shard * self.cp) % self.ep:
            raise ParallelLayoutError(
                f"ep={self.ep} must divide dp_shard x cp = {self.dp_shard * self.cp}: experts are spread over "
                "the data-parallel (and context-parallel) ranks of one replica"
            )

    @property
    def dp(self) -> int:
        """Data-parallel degree: how many different micro-batches are processed at once."""
        return self.dp_replicate * self.dp_shard

    def sizes(self) -> dict[str, int]:
        """The mesh dimensions with more than one rank (``dp_shard`` always: FSDP needs a mesh)."""
        sizes = {name: getattr(self, name) for name in MESH_ORDER}
        return {name: size for name, size in sizes.items() if size > 1 or name == "dp_shard"}

    def build_mesh(self, device_type: str):
        """A ``DeviceMesh`` over the default process group with :meth:`sizes` as named dimensions."""
        from torch.distributed.device_mesh import init_device_mesh

        sizes = self.sizes()
        return init_device_mesh(device_type, tuple(sizes.values()), mesh_dim_names=tuple(sizes))

    @staticmethod
    def sharded(mesh):
        """What FSDP shards parameters over: :meth:`data_parallel`, with ``cp`` folded into ``dp_shard``
        (``dp_shard_cp``) when sequences are split. Context-parallel peers hold different tokens of the same
        sequences, so like data-parallel peers they each own a shard and their gradients are summed."""
        names = mesh.mesh_dim_names or ()
        if "cp" not in names:
            return ParallelDims.data_parallel(mesh)
        flat = mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
        # HSDP needs the 2-D (replicate, shard) mesh, sliced from the root by the flattened name
        return mesh["dp_replicate", "dp_shard_cp"] if "dp_replicate" in names else flat

    @staticmethod
    def data_parallel(mesh):
        """The data-parallel part of ``mesh``: ``dp_shard``, or ``(dp_replicate, dp_shard)`` for HSDP (the
        2-D mesh FSDP2 replicates over its first dimension and shards over its second)."""
        names = mesh.mesh_dim_names or ()
        return mesh["dp_replicate", "dp_shard"] if "dp_replicate" in names else mesh["dp_shard"]
