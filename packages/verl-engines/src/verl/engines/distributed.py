"""Process-group setup for engines used outside a worker group (scripts, benchmarks, notebooks).

Inside a verl worker group the controller has already initialised torch.distributed; then this does
nothing. Otherwise it joins the group described by the usual ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``
environment (torchrun), or starts a single-process group that needs no network port.
"""

from __future__ import annotations

import logging
import os

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from verl.core.parallel_dims import ParallelDims, ParallelLayoutError

logger = logging.getLogger(__name__)


def ensure_process_group(platform) -> None:
    if dist.is_initialized():
        return
    backend = platform.dist_backend
    if os.environ.get("WORLD_SIZE") and os.environ.get("MASTER_ADDR"):
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if platform.device_name != "cpu":
            platform.set_device(local_rank)
        dist.init_process_group(backend=backend, init_method="env://")
    else:
        if platform.device_name != "cpu":
            platform.set_device(0)
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    logger.info("initialised torch.distributed (%s): rank %d of %d", backend, dist.get_rank(), dist.get_world_size())


def fsdp_parallel_dims(fsdp_size: int, sequence_parallel: int = 1, world: int | None = None) -> ParallelDims:
    """Data parallelism over the default group: FSDP shards of ``fsdp_size`` ranks (-1: all of them),
    replicated over the rest (HSDP). With ``sequence_parallel`` > 1 each shard group's ranks are split into
    groups of that many neighbours (the ``cp`` dimension: Ulysses), which hold one data-parallel batch
    between them; FSDP still shards over all ``fsdp_size`` ranks (:meth:`ParallelDims.sharded`). ``world``:
    the default group's size unless given."""
    world = dist.get_world_size() if world is None else world
    sp = sequence_parallel
    if sp < 1 or world % sp:
        raise ParallelLayoutError(
            f"ulysses_sequence_parallel_size={sp} must divide the {world} ranks of the group; pick a divisor "
            f"of {world} (1 turns sequence parallelism off)"
        )
    fsdp_size = world if fsdp_size == -1 else fsdp_size
    if fsdp_size < 1 or world % fsdp_size:
        raise ParallelLayoutError(
            f"fsdp_config.fsdp_size={fsdp_size} must divide the {world} ranks of the group (or be -1: shard "
            "over all of them)"
        )
    if fsdp_size < sp and sp % fsdp_size == 0:
        # verl shards over fsdp_size ranks and forms its Ulysses groups independently; here a sequence-parallel
        # group lies within one shard group, so the shard grows to the group: the same numbers, less memory.
        logger.warning(
            "fsdp_config.fsdp_size=%d is smaller than ulysses_sequence_parallel_size=%d: sharding over groups of %d "
            "ranks instead (each sequence-parallel group is one FSDP shard group here)",
            fsdp_size,
            sp,
            sp,
        )
        fsdp_size = sp
    if fsdp_size % sp:
        raise ParallelLayoutError(
            f"ulysses_sequence_parallel_size={sp} and fsdp_config.fsdp_size={fsdp_size}: one must divide the other "
            "(a sequence-parallel group lies within one FSDP shard group); change one of them (or set fsdp_size=-1)"
        )
    return ParallelDims(world_size=world, dp_replicate=world // fsdp_size, dp_shard=fsdp_size // sp, cp=sp)


def flat_data_parallel(dp_mesh: DeviceMesh) -> DeviceMesh:
    """One dimension over every data-parallel rank (both dimensions of an HSDP mesh): whose rank and group
    say which micro-batches a rank holds and where per-batch counts are summed."""
    return dp_mesh if dp_mesh.ndim == 1 else dp_mesh._flatten("dp")
