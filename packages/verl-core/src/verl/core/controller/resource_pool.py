"""``ResourcePool``: the devices a worker group runs on, held as Ray placement groups.

``ResourcePool(process_on_nodes=[4, 4])`` asks for two placement groups of 4 bundles each; each bundle is
one unit of the current platform's Ray resource (``get_platform().ray_resource_name``: "GPU", "NPU", ...)
and hosts one process, rank ``r`` in bundle ``r`` (counting through the entries in order). Each entry is
packed onto one node (``STRICT_PACK``); on a cluster, entries land wherever they fit.

On the CPU platform the resource is Ray's logical "CPU": one bundle is one CPU *slot* (``ray.init
(num_cpus=8)`` gives 8 slots however many physical cores the machine has); torch threads per process are
set separately from the real core count.

Several worker groups may share a pool's bundles (rank ``r`` of each group in bundle ``r``), up to
``max_colocate_count`` groups; each of their processes then asks for ``1 / max_colocate_count`` of the
bundle. Fusing roles into one process with ``WorkerGroup.colocated`` is usually better (one process
per device, one copy of CUDA context and process group).
"""

from __future__ import annotations

import logging
import math
import weakref
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import ray
from ray.exceptions import GetTimeoutError
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group

from verl.core.platform import get_platform

logger = logging.getLogger(__name__)


class PlacementError(RuntimeError):
    """The cluster cannot hold the requested pool."""


#: Pools placed in this driver and not shut down: their processes share their nodes' cores.
_placed_pools: weakref.WeakSet[ResourcePool] = weakref.WeakSet()


def processes_on_node(node_id: str) -> int:
    """Worker processes this driver's placed pools put on ``node_id``: each pool's processes there, once for
    every worker group on it (at least one, the group being started)."""
    return sum(
        sum(1 for slot in pool._slots or [] if slot.node_id == node_id) * max(1, len(pool.holders))
        for pool in list(_placed_pools)
    )


@dataclass(frozen=True)
class BundleSlot:
    """Where rank ``rank`` of a group on this pool runs."""

    rank: int
    placement_group: PlacementGroup
    bundle_index: int
    node_id: str
    local_rank: int
    local_world_size: int


class ResourcePool:
    def __init__(
        self,
        process_on_nodes: Sequence[int],
        *,
        max_colocate_count: int = 1,
        resource_name: str | None = None,
        placement_timeout_s: float = 120.0,
    ):
        counts = list(process_on_nodes)
        if not counts or any(not isinstance(c, int) or c <= 0 for c in counts):
            raise ValueError(
                f"ResourcePool: process_on_nodes must be positive process counts, got {process_on_nodes!r}"
            )
        if max_colocate_count < 1:
            raise ValueError(f"ResourcePool: max_colocate_count must be >= 1, got {max_colocate_count}")
        self.process_on_nodes = counts
        self.max_colocate_count = max_colocate_count
        self.resource_name = resource_name or get_platform().ray_resource_name
        self.placement_timeout_s = placement_timeout_s
        self._placement_groups: list[PlacementGroup] | None = None
        self._slots: list[BundleSlot] | None = None
        self._holders: list[str] = []

    @property
    def world_size(self) -> int:
        return sum(self.process_on_nodes)

    # -- placement ------------------------------------------------------------------------------------
    def slots(self) -> list[BundleSlot]:
        """One slot per process, placing the pool on first use."""
        slots = self._slots if self._slots is not None else self._place()
        return list(slots)

    def _place(self) -> list[BundleSlot]:
        """Place the bundles; keeps (and returns) one slot per process."""
        if not ray.is_initialized():
            raise RuntimeError("ResourcePool: Ray is not running; call verl.core.controller.init_ray() first")
        self._check_capacity()
        bundle = {self.resource_name: 1.0}
        pgs = [placement_group([dict(bundle) for _ in range(n)], strategy="STRICT_PACK") for n in self.process_on_nodes]
        try:
            ray.get([pg.ready() for pg in pgs], timeout=self.placement_timeout_s)
        except GetTimeoutError:
            for pg in pgs:
                remove_placement_group(pg)
            raise PlacementError(
                f"ResourcePool{self.process_on_nodes}: could not place the bundles of {bundle} within "
                f"{self.placement_timeout_s:g} s; available now: {ray.available_resources().get(self.resource_name, 0):g} "
                f"{self.resource_name}. Other pools or jobs may hold them: shut those down or shrink this pool"
            ) from None
        slots = []
        for pg in pgs:
            nodes = placement_group_table(pg)["bundles_to_node_id"]
            for index in range(pg.bundle_count):
                slots.append((pg, index, nodes[index]))
        per_node = Counter(node for _, _, node in slots)
        seen: Counter[str] = Counter()
        self._slots = []
        for rank, (pg, index, node) in enumerate(slots):
            self._slots.append(BundleSlot(rank, pg, index, node, seen[node], per_node[node]))
            seen[node] += 1
        self._placement_groups = pgs
        _placed_pools.add(self)
        return self._slots

    def _check_capacity(self) -> None:
        """Fail at once, not after the placement timeout, when the cluster can never hold the pool."""
        name = self.resource_name
        per_node = [n["Resources"].get(name, 0) for n in ray.nodes() if n.get("Alive")]
        total = sum(per_node)
        if total < self.world_size:
            raise PlacementError(
                f"ResourcePool{self.process_on_nodes} needs {self.world_size} {name} but the Ray cluster has "
                f"{total:g}; start Ray with more (init_ray(num_cpus=...) on CPU), or ask for fewer processes"
            )
        largest = max(per_node, default=0)
        if max(self.process_on_nodes) > largest:
            raise PlacementError(
                f"ResourcePool{self.process_on_nodes}: each entry is packed onto one node, but the largest node "
                f"has {largest:g} {name}; split the entry across nodes (e.g. [{largest:g}, ...])"
            )

    # -- sharing between groups -----------------------------------------------------------------------
    def acquire(self, holder: str) -> float:
        """Reserve a share of every bundle for one worker group; returns the resource amount per process."""
        if len(self._holders) >= self.max_colocate_count:
            raise PlacementError(
                f"ResourcePool{self.process_on_nodes} already hosts {len(self._holders)} worker group(s) "
                f"({', '.join(self._holders)}) and max_colocate_count={self.max_colocate_count}; create the pool "
                "with a larger max_colocate_count, fuse the roles with WorkerGroup.colocated, or shut a group down"
            )
        self._holders.append(holder)
        # Ray accepts fractions in steps of 1e-4; round down so max_colocate_count shares fit in one bundle.
        return math.floor(10_000 / self.max_colocate_count) / 10_000

    def release(self, holder: str) -> None:
        if holder in self._holders:
            self._holders.remove(holder)

    @property
    def holders(self) -> list[str]:
        return list(self._holders)

    def shutdown(self) -> None:
        """Give the bundles back to Ray (kills nothing: shut the groups down first)."""
        if self._holders:
            logger.warning("ResourcePool.shutdown while groups still use it: %s", ", ".join(self._holders))
        for pg in self._placement_groups or []:
            remove_placement_group(pg)
        self._placement_groups = None
        self._slots = None
        _placed_pools.discard(self)

    def __repr__(self) -> str:
        state = "placed" if self._slots is not None else "not placed"
        return f"ResourcePool({self.process_on_nodes}, resource={self.resource_name!r}, {state})"


def actor_resource_options(resource_name: str, amount: float) -> dict:
    """Ray actor options asking for ``amount`` of ``resource_name`` (Ray wants CPU and GPU as keywords)."""
    if resource_name == "CPU":
        return {"num_cpus": amount}
    if resource_name == "GPU":
        return {"num_cpus": 0, "num_gpus": amount}
    return {"num_cpus": 0, "resources": {resource_name: amount}}
