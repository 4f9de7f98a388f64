"""``WorkerHost``: the Ray actor behind one rank. It sets the process up (environment, visible devices,
torch threads, the default process group) and then hosts one worker object per role.

A plain group has one role; a colocated group has several (actor, rollout, ref, ...) that share this
process, its devices and its process group. The driver calls :meth:`WorkerHost.execute` with the role
and method to run.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import ray

from verl.core.controller.death_cause import read_oom_kill_count
from verl.core.controller.worker import DPInfo, Worker

if TYPE_CHECKING:  # torch.distributed is imported where a process group is set up, not with this module
    from torch.distributed import TCPStore


@dataclass(frozen=True)
class WorkerSpec:
    """A worker class and the arguments to build it with."""

    cls: type
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, value: Any) -> WorkerSpec:
        """Accepts a WorkerSpec, a class, or a tuple ``(cls,)``, ``(cls, args)``, ``(cls, args, kwargs)``."""
        if isinstance(value, WorkerSpec):
            spec = value
        elif isinstance(value, type):
            spec = WorkerSpec(value)
        elif isinstance(value, tuple) and 1 <= len(value) <= 3 and isinstance(value[0], type):
            spec = WorkerSpec(
                value[0], tuple(value[1]) if len(value) > 1 else (), dict(value[2]) if len(value) > 2 else {}
            )
        else:
            raise TypeError(f"expected a Worker subclass, a WorkerSpec or a (cls, args, kwargs) tuple, got {value!r}")
        if not issubclass(spec.cls, Worker):
            raise TypeError(f"{spec.cls.__qualname__} must subclass verl.core.controller.Worker")
        return spec


@dataclass(frozen=True)
class HostConfig:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    #: Processes sharing this node's cores or devices (all groups on the pool), for torch threads.
    processes_on_node: int
    resource_name: str
    roles: dict[str, WorkerSpec]
    dist_timeout_s: float


@dataclass(frozen=True)
class CallHeader:
    role: str
    method: str
    return_output: bool = True
    #: For data-parallel calls: the coordinates the driver dispatched by (checked against the worker's).
    expected_dp: DPInfo | None = None


class DPLayoutChangedError(RuntimeError):
    pass


class WorkerHost:
    """One rank's process. Wrapped with ``ray.remote`` by the worker group."""

    def __init__(self, config: HostConfig):
        # What the engines log at INFO (sizes they chose, settings without effect) reaches the driver's
        # console through Ray's forwarding of this process's stderr; unconfigured, Python drops it.
        if not logging.getLogger().handlers:
            logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        self._config = config
        #: The rendezvous store: served by rank 0 (open_store), a client of it on the other ranks.
        self._store: TCPStore | None = None
        self._roles: dict[str, Worker] = {}
        os.environ.update(
            {
                "RANK": str(config.rank),
                "WORLD_SIZE": str(config.world_size),
                "LOCAL_RANK": str(config.local_rank),
                "LOCAL_WORLD_SIZE": str(config.local_world_size),
            }
        )
        # Restrict the devices before anything initializes the device runtime.
        from verl.core.platform import get_platform

        self._platform = get_platform()
        ids = ray.get_runtime_context().get_accelerator_ids().get(config.resource_name, [])
        visible = self._platform.visible_devices_for([int(i) for i in ids]) if ids else {}
        os.environ.update(visible)
        self._device_index = 0 if (visible or not ids) else int(ids[0])

    # -- setup, in the order the group calls it ------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        return {
            "node_ip": ray.util.get_node_ip_address(),
            "node_id": ctx.get_node_id(),
            "pid": os.getpid(),
            "oom_kills": read_oom_kill_count(),
        }

    def open_store(self) -> int:
        """Rank 0 only: serve the rendezvous store on a port the OS picks here (no guessing on the driver,
        no window in which another process could take it) and return the port.

        The store listens on this node's Ray address only (127.0.0.1 for verl's local Ray), not on every
        interface as TCPStore does when it opens its own socket."""
        from verl.core.rendezvous import serve_store

        store = serve_store(ray.util.get_node_ip_address(), self._config.world_size, self._config.dist_timeout_s)
        self._store = store
        return int(store.port)

    def init_distributed(self, master_addr: str, master_port: int) -> None:
        import torch
        import torch.distributed as dist

        from verl.core.rendezvous import join_store

        cfg = self._config
        os.environ["MASTER_ADDR"] = master_addr
        os.environ["MASTER_PORT"] = str(master_port)
        if _is_loopback(master_addr) and "GLOO_SOCKET_IFNAME" not in os.environ:
            # Every rank is on this machine (verl's local Ray): gloo's sockets stay on loopback too, instead
            # of the interface the host name resolves to.
            loopback = _loopback_interface()
            if loopback:
                os.environ["GLOO_SOCKET_IFNAME"] = loopback
        torch.set_num_threads(self._platform.torch_threads_per_worker(cfg.processes_on_node))
        self._platform.set_device(self._device_index)
        timeout = timedelta(seconds=cfg.dist_timeout_s)
        if self._store is None:
            self._store = join_store(master_addr, master_port, cfg.world_size, cfg.dist_timeout_s)
        dist.init_process_group(
            backend=self._platform.dist_backend,
            store=self._store,
            rank=cfg.rank,
            world_size=cfg.world_size,
            timeout=timeout,
        )

    def build_role(self, role: str) -> None:
        spec = self._config.roles[role]
        self._roles[role] = spec.cls(*spec.args, **spec.kwargs)

    # -- calls ----------------------------------------------------------------------------------------
    def dp_info(self, role: str) -> DPInfo:
        return self._roles[role].dp_info

    def execute(self, header: CallHeader, *args: Any, **kwargs: Any) -> Any:
        worker = self._roles[header.role]
        if header.expected_dp is not None and worker.dp_info != header.expected_dp:
            raise DPLayoutChangedError(
                f"role {header.role!r} rank {self._config.rank} now reports {worker.dp_info} but the driver "
                f"dispatched {header.method} by {header.expected_dp}: set_dp_info was called after the group "
                "cached its data-parallel layout; call it while building the model, or call "
                "group.refresh_dp_layout() after changing it"
            )
        output = getattr(worker, header.method)(*args, **kwargs)
        return output if header.return_output else None

    def ping(self) -> bool:
        return True


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def _loopback_interface() -> str | None:
    """The name of this machine's loopback interface ("lo" on Linux, "lo0" on macOS), if it has one."""
    names = {name for _, name in socket.if_nameindex()}
    return next((name for name in ("lo", "lo0") if name in names), None)
