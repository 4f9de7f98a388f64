"""``Worker``: the base class of everything a :class:`~verl.core.controller.WorkerGroup` runs.

A worker is plain Python running in one Ray actor per process. By the time its ``__init__`` runs, the
controller has set ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT``, restricted the visible devices and initialized the default ``torch.distributed`` process
group on the platform's backend, so a worker may run collectives right away.

Data-parallel coordinates: by default every rank is its own data-parallel rank (``dp_rank == rank``).
A worker that builds model-parallel groups (tensor/pipeline/sequence parallel) calls
:meth:`Worker.set_dp_info` so that data-parallel dispatch sends each shard to every rank of the matching
model-parallel group and collects the result from one of them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class DPInfo:
    """Where a rank sits for data-parallel dispatch."""

    dp_rank: int
    dp_size: int
    #: Whether the driver collects this rank's output for its ``dp_rank`` (exactly one rank per dp rank).
    is_collect: bool


class Worker:
    """Base class of worker-group members. Subclasses need not call ``super().__init__()``."""

    @property
    def rank(self) -> int:
        return int(os.environ["RANK"])

    @property
    def world_size(self) -> int:
        return int(os.environ["WORLD_SIZE"])

    @property
    def local_rank(self) -> int:
        return int(os.environ["LOCAL_RANK"])

    @property
    def local_world_size(self) -> int:
        return int(os.environ["LOCAL_WORLD_SIZE"])

    # -- data-parallel coordinates -----------------------------------------------------------------------
    def set_dp_info(self, dp_rank: int, dp_size: int, is_collect: bool) -> None:
        """Declare this rank's data-parallel coordinates, e.g. with world 4 = dp 2 x tp 2, rank 3 calls
        ``set_dp_info(dp_rank=1, dp_size=2, is_collect=(tp_rank == 0))``.

        Call it while building the model (before the first data-parallel call of the group): the
        driver caches the layout at that call and each later call checks it has not changed.
        """
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"set_dp_info: dp_rank must be in [0, {dp_size}), got {dp_rank}")
        if self.world_size % dp_size:
            raise ValueError(f"set_dp_info: dp_size {dp_size} does not divide the world size {self.world_size}")
        self._verl_dp_info = DPInfo(int(dp_rank), int(dp_size), bool(is_collect))

    @property
    def dp_info(self) -> DPInfo:
        info = getattr(self, "_verl_dp_info", None)
        if info is None:  # pure data parallelism: every rank is its own dp rank and is collected
            return DPInfo(self.rank, self.world_size, True)
        return info

    @property
    def dp_rank(self) -> int:
        return self.dp_info.dp_rank

    @property
    def dp_size(self) -> int:
        return self.dp_info.dp_size

    @property
    def is_collect_rank(self) -> bool:
        return self.dp_info.is_collect
