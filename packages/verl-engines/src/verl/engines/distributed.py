"""Process-group setup for engines used outside a worker group (scripts, benchmarks, notebooks).

Inside a verl worker group the controller has already initialised torch.distributed; then this does
nothing. Otherwise it joins the group described by the usual ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``
environment (torchrun), or starts a single-process group that needs no network port.
"""

from __future__ import annotations

import logging
import os

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

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


def data_parallel_mesh(platform) -> DeviceMesh:
    """A 1-D mesh over every rank of the default group, on the platform's device type."""
    return init_device_mesh(platform.device_name, (dist.get_world_size(),), mesh_dim_names=("dp",))
