"""The hybrid controller on Ray: one driver process runs the algorithm as plain Python and calls
worker groups, each a set of SPMD processes placed on a resource pool.

See ``docs/controller.md`` for the picture and a worked example.
"""

# Registers the built-in dispatch modes.
from verl.core.controller import builtin_modes  # noqa: F401
from verl.core.controller.decorator import Execute, MethodSpec, register
from verl.core.controller.dispatch import (
    DISPATCH_MODES,
    Dispatch,
    Dispatched,
    DispatchMode,
    DPCoordinates,
    GroupLayout,
    RankCall,
    register_dispatch_mode,
)
from verl.core.controller.dp_shards import ShardLayout
from verl.core.controller.errors import (
    RankSite,
    WorkerCallError,
    WorkerDiedError,
    WorkerGroupError,
    WorkerTimeoutError,
)
from verl.core.controller.futures import GroupFuture
from verl.core.controller.host import WorkerSpec
from verl.core.controller.ray_init import init_ray, worker_env_vars
from verl.core.controller.resource_pool import PlacementError, ResourcePool
from verl.core.controller.role import GroupMethod, RoleHandle
from verl.core.controller.worker import DPInfo, Worker
from verl.core.controller.worker_group import WorkerGroup

__all__ = [
    "DISPATCH_MODES",
    "DPCoordinates",
    "DPInfo",
    "Dispatch",
    "DispatchMode",
    "Dispatched",
    "Execute",
    "GroupFuture",
    "GroupLayout",
    "GroupMethod",
    "MethodSpec",
    "PlacementError",
    "RankCall",
    "RankSite",
    "ResourcePool",
    "RoleHandle",
    "ShardLayout",
    "Worker",
    "WorkerCallError",
    "WorkerDiedError",
    "WorkerGroup",
    "WorkerGroupError",
    "WorkerSpec",
    "WorkerTimeoutError",
    "init_ray",
    "register",
    "register_dispatch_mode",
    "worker_env_vars",
]
