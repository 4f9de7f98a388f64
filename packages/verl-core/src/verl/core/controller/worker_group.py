"""``WorkerGroup``: one Ray actor per process of a resource pool, driven from the driver as one object.

Each method of the worker class marked with :func:`~verl.core.controller.register` becomes a method of
the group: ``wg.compute_log_prob(batch)`` splits the arguments by the method's dispatch mode, calls every
rank, waits (reporting the first failing rank with its traceback, a dead rank, or a timeout) and gathers.

A colocated group fuses several roles into each process (``WorkerGroup.colocated(pool, {"actor": ...,
"ref": ...})``): the roles share the process, its devices and its process group, and each role's methods
are reached through it (``wg.actor.update(batch)``, ``wg.ref.compute_ref_log_prob(batch)``).
"""

from __future__ import annotations

import itertools
import logging
import weakref
from collections.abc import Mapping
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from verl.core.controller.decorator import registered_methods
from verl.core.controller.errors import RankSite, wait_for
from verl.core.controller.host import HostConfig, WorkerHost, WorkerSpec
from verl.core.controller.ray_init import env_missing_from_job
from verl.core.controller.resource_pool import ResourcePool, actor_resource_options, processes_on_node
from verl.core.controller.role import RoleHandle

logger = logging.getLogger(__name__)

_RemoteHost = ray.remote(max_restarts=0, max_task_retries=0)(WorkerHost)
_group_ids = itertools.count()

# Instance attributes: a registered method or role of the same name would hide them.
_GROUP_RESERVED = frozenset({"resource_pool", "call_timeout_s"})


class WorkerGroup:
    """One Ray actor per process of ``resource_pool``, each running ``worker_cls(*args, **kwargs)``.

    Group options are keyword-only and reserved (a worker that takes a keyword of the same name gets it
    through ``WorkerSpec``/``WorkerGroup.colocated``):

    - ``group_name``: the role name in errors (default: the worker class name);
    - ``call_timeout_s``: how long a call may go without an answer before :class:`WorkerTimeoutError`
      (None: no limit; a dead rank is reported as soon as Ray notices, whatever the timeout);
    - ``setup_timeout_s``: the same bound for starting the processes and building the workers;
    - ``dist_timeout_s``: torch.distributed's timeout for collectives in the workers.
    """

    def __init__(
        self,
        resource_pool: ResourcePool,
        worker_cls: type,
        *args: Any,
        group_name: str | None = None,
        call_timeout_s: float | None = None,
        setup_timeout_s: float = 300.0,
        dist_timeout_s: float = 1800.0,
        **kwargs: Any,
    ):
        spec = WorkerSpec.of((worker_cls, args, kwargs))
        for method in registered_methods(worker_cls):
            if method in _GROUP_RESERVED or hasattr(WorkerGroup, method):
                raise ValueError(
                    f"{worker_cls.__qualname__}.{method} is registered but its name is taken by the group API "
                    f"(WorkerGroup.{method}); rename the method"
                )
        name = group_name or worker_cls.__name__
        self._start(resource_pool, {name: spec}, call_timeout_s, setup_timeout_s, dist_timeout_s)
        for method, bound in self._roles[name].methods.items():
            setattr(self, method, bound)

    @classmethod
    def colocated(
        cls,
        resource_pool: ResourcePool,
        roles: Mapping[str, Any],
        *,
        call_timeout_s: float | None = None,
        setup_timeout_s: float = 300.0,
        dist_timeout_s: float = 1800.0,
    ) -> WorkerGroup:
        """One process per bundle hosting every role of ``roles`` (name -> worker class, ``WorkerSpec`` or
        ``(cls, args, kwargs)``); each role is an attribute of the group: ``wg.actor.update(batch)``.

        Roles are built in the order given, all ranks together, after the process group exists.
        """
        if not roles:
            raise ValueError("WorkerGroup.colocated: give at least one role")
        for role in roles:
            if not role.isidentifier() or role in _GROUP_RESERVED or hasattr(cls, role):
                raise ValueError(
                    f"WorkerGroup.colocated: role name {role!r} must be an identifier not taken by the group API"
                )
        group = cls.__new__(cls)
        group._start(
            resource_pool,
            {r: WorkerSpec.of(s) for r, s in roles.items()},
            call_timeout_s,
            setup_timeout_s,
            dist_timeout_s,
        )
        for role, handle in group._roles.items():
            setattr(group, role, handle)
        return group

    # -- start ----------------------------------------------------------------------------------------
    def _start(
        self,
        pool: ResourcePool,
        roles: dict[str, WorkerSpec],
        call_timeout_s: float | None,
        setup_timeout_s: float,
        dist_timeout_s: float,
    ) -> None:
        self.resource_pool = pool
        self.call_timeout_s = call_timeout_s
        self._alive = False
        self._holder = f"{'+'.join(roles)}#{next(_group_ids)}"
        self._hosts: list[Any] = []
        self._infos: list[dict[str, Any]] = [{"node_ip": "?", "node_id": "?", "pid": None}] * pool.world_size
        slots = pool.slots()
        amount = pool.acquire(self._holder)
        self._release = weakref.finalize(self, pool.release, self._holder)
        try:
            self._roles = {name: RoleHandle(self, name, spec) for name, spec in roles.items()}
            options = actor_resource_options(pool.resource_name, amount)
            env = env_missing_from_job()
            if env:
                options["runtime_env"] = {"env_vars": env}
            for slot in slots:
                config = HostConfig(
                    rank=slot.rank,
                    world_size=pool.world_size,
                    local_rank=slot.local_rank,
                    local_world_size=slot.local_world_size,
                    processes_on_node=processes_on_node(slot.node_id),
                    resource_name=pool.resource_name,
                    roles=roles,
                    dist_timeout_s=dist_timeout_s,
                )
                strategy = PlacementGroupSchedulingStrategy(slot.placement_group, slot.bundle_index)
                self._hosts.append(_RemoteHost.options(scheduling_strategy=strategy, **options).remote(config))
            self._setup(list(roles), setup_timeout_s)
        except BaseException:
            self._kill_hosts()
            self._release()
            raise
        self._alive = True

    def _setup(self, roles: list[str], timeout_s: float) -> None:
        setup_sites = [RankSite("<process start>", r) for r in range(len(self._hosts))]
        self._infos = wait_for([h.describe.remote() for h in self._hosts], setup_sites, "start", timeout_s)
        sites = self.sites
        port = wait_for([self._hosts[0].open_store.remote()], sites[:1], "rendezvous store", timeout_s)[0]
        master_addr = self._infos[0]["node_ip"]
        refs = [h.init_distributed.remote(master_addr, port) for h in self._hosts]
        wait_for(refs, sites, "init_process_group", timeout_s)
        for role in roles:  # all ranks build a role together: its __init__ may run collectives
            role_sites = self._roles[role].sites
            wait_for([h.build_role.remote(role) for h in self._hosts], role_sites, f"{role}.__init__", timeout_s)
        logger.info("worker group %s: %d processes on %s", self._holder, len(self._hosts), self.resource_pool)

    # -- public API -----------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return len(self._hosts)

    @property
    def roles(self) -> dict[str, RoleHandle]:
        return dict(self._roles)

    def role(self, name: str) -> RoleHandle:
        try:
            return self._roles[name]
        except KeyError:
            raise KeyError(f"this group has no role {name!r}; roles: {sorted(self._roles)}") from None

    @property
    def actors(self) -> list[Any]:
        """The Ray actor handle of each rank (for inspection; call workers through the group)."""
        return list(self._hosts)

    @property
    def rank_infos(self) -> list[dict[str, Any]]:
        """Each rank's process: node IP, node id, pid (placeholders until the processes started)."""
        return list(self._infos)

    @property
    def sites(self) -> list[RankSite]:
        """Where each rank runs (node IP, node id, pid)."""
        name = "+".join(self._roles) if hasattr(self, "_roles") else "<setup>"
        return [RankSite.from_info(name, r, info) for r, info in enumerate(self._infos)]

    def refresh_dp_layout(self) -> None:
        for handle in self._roles.values():
            handle.refresh_dp_layout()

    def check_health(self, timeout_s: float = 10.0) -> None:
        """Ping every rank: raises :class:`WorkerDiedError` for a dead one, :class:`WorkerTimeoutError` for
        one that does not answer within ``timeout_s`` (hung, or still busy with an earlier call)."""
        self.check_alive()
        wait_for([h.ping.remote() for h in self._hosts], self.sites, "health check", timeout_s)

    def shutdown(self) -> None:
        """Kill the group's processes and free its share of the pool. The pool itself stays placed."""
        self._kill_hosts()
        self._alive = False
        self._release()

    def _kill_hosts(self) -> None:
        for host in self._hosts:
            try:
                ray.kill(host, no_restart=True)
            except Exception as exc:  # already gone: nothing left to free
                logger.debug("ray.kill of a worker host failed: %s", exc)

    def check_alive(self) -> None:
        """Raises if the group was shut down."""
        if not self._alive:
            raise RuntimeError(f"worker group {self._holder} was shut down; create a new one")

    def __repr__(self) -> str:
        return f"<WorkerGroup {self._holder} world_size={self.world_size} roles={sorted(self._roles)}>"
