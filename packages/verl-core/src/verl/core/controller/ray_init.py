"""Starting Ray (or joining a cluster) the way verl needs it, and the environment workers inherit.

A local Ray started here listens on 127.0.0.1 only, dashboard off, unless told otherwise (``expose``,
``include_dashboard``): see :func:`init_ray`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import ray

from verl.core.platform import get_platform

logger = logging.getLogger(__name__)

#: Driver environment that worker processes must see too, so plugins and platforms load the same way.
PROPAGATED_ENV_PREFIXES = ("VERL_",)
PROPAGATED_ENV_NAMES = ("PYTHONPATH",)


def worker_env_vars(extra_names: Iterable[str] = ()) -> dict[str, str]:
    """The driver's ``VERL_*`` and ``PYTHONPATH`` (plus ``extra_names``) as they are now."""
    names = set(PROPAGATED_ENV_NAMES) | set(extra_names)
    return {k: v for k, v in os.environ.items() if k in names or k.startswith(PROPAGATED_ENV_PREFIXES)}


def env_missing_from_job() -> dict[str, str]:
    """Propagated variables the Ray job's runtime environment does not already give every worker (a job
    joined without :func:`init_ray`, or a variable set after it); worker groups add these per actor."""
    job_env = (ray.get_runtime_context().runtime_env or {}).get("env_vars", {}) or {}
    return {k: v for k, v in worker_env_vars().items() if job_env.get(k) != v}


def init_ray(
    address: str | None = None,
    *,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    include_dashboard: bool = False,
    expose: bool = False,
    runtime_env: dict[str, Any] | None = None,
    extra_env_names: Iterable[str] = (),
    **ray_init_kwargs: Any,
) -> Any:
    """Start a local Ray, or join a cluster, with workers inheriting the driver's ``VERL_*`` and ``PYTHONPATH``.

    - ``address`` (the trainer passes ``trainer.ray_address``), else the ``RAY_ADDRESS`` environment
      variable, joins an existing cluster; ``num_cpus``/``num_gpus`` are then the cluster's business and
      must not be given, and so is what the cluster listens on.
    - Otherwise a local Ray starts with ``num_cpus``/``num_gpus`` logical resources (on the CPU platform
      ``num_cpus`` is the number of worker slots, not physical cores), the dashboard off unless
      ``include_dashboard=True``, and, unless ``expose=True``, every server of it (GCS, raylet, object
      manager, runtime-env agent, each worker's gRPC server, the dashboard and its agent when on) listening
      on 127.0.0.1 only: see :func:`start_loopback_only`.
    - ``expose=True``: Ray's own default instead: the node takes the machine's reachable address and its
      servers listen on all interfaces (the dashboard, when on, too), so other machines can join it or
      reach its dashboard. Anyone who can reach those ports and holds the cluster's token (Ray's token
      authentication, on by default in Ray 2.60 unless ``RAY_AUTH_MODE=disabled``) can run code as this
      user: turn it on only on a trusted network.

    Returns Ray's context, or None when this process is already connected (nothing is changed then).
    """
    address = address or os.environ.get("RAY_ADDRESS") or None
    joining = bool(address) and address != "local"
    if joining and (num_cpus is not None or num_gpus is not None):
        raise ValueError(
            f"init_ray: num_cpus/num_gpus only apply when starting a local Ray, but address={address!r} "
            "joins an existing cluster; drop them (the cluster's nodes declare their resources)"
        )
    if ray.is_initialized():
        logger.info("init_ray: Ray is already initialized in this process; leaving it as it is")
        return None
    env = {**worker_env_vars(extra_env_names), **((runtime_env or {}).get("env_vars") or {})}
    job_runtime_env = {**(runtime_env or {}), "env_vars": env}
    if joining:
        logger.info("init_ray: joining the Ray cluster at %s", address)
        return ray.init(address=address, runtime_env=job_runtime_env, **ray_init_kwargs)
    logger.info("init_ray: starting a local Ray (num_cpus=%s, num_gpus=%s)", num_cpus, num_gpus)
    # This machine's platform is the workers' (a cluster's nodes may differ: their own setup decides there).
    job_runtime_env["env_vars"] = {**get_platform().worker_process_env(), **env}
    options = dict(
        # "local", not None: None would join a `ray start` cluster found on this machine.
        address="local",
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        include_dashboard=include_dashboard,
        runtime_env=job_runtime_env,
        **ray_init_kwargs,
    )
    context = _start_exposed(options) if expose else start_loopback_only(options)
    warn_if_token_readable_by_others()  # after the start: Ray writes the token file on its first start
    return context


def _start_exposed(options: dict[str, Any]) -> Any:
    """A local Ray on Ray's own defaults: the machine's reachable address, servers on all interfaces."""
    options.setdefault("dashboard_host", "0.0.0.0")
    context = ray.init(**options)
    logger.warning(
        "init_ray: expose=True: the local Ray listens on all interfaces (node address %s)%s; anyone who can "
        "reach it and holds its token can run code as this user",
        ray.util.get_node_ip_address(),
        ", dashboard included" if options.get("include_dashboard") else "",
    )
    return context


def start_loopback_only(options: dict[str, Any]) -> Any:
    """``ray.init(**options)`` with the node's address 127.0.0.1, so that every Ray server listens there only.

    Ray binds its servers to loopback exactly when the node's address is 127.0.0.1 (the GCS, raylet and
    worker gRPC servers, the runtime-env and dashboard agents, the metrics exporters all test for it). But
    ``ray.init(_node_ip_address="127.0.0.1")`` alone does not get there: on Linux Ray replaces a loopback
    address by the machine's reachable one (``services.resolve_ip_for_localhost``), keeping it only when
    multi-node clusters are off (``ray_constants.ENABLE_RAY_CLUSTER``, the Windows/macOS default). A local
    Ray started by verl is a one-node cluster, so that switch is turned off for the duration of the start.
    """
    options = {**options, "_node_ip_address": "127.0.0.1"}
    options.setdefault("dashboard_host", "127.0.0.1")
    with _single_node_cluster():
        context = ray.init(**options)
    node_ip = ray.util.get_node_ip_address()
    if node_ip != "127.0.0.1":
        logger.warning(
            "init_ray: this Ray version did not keep 127.0.0.1 as the node address (it uses %s): its servers "
            "listen on all interfaces, guarded only by Ray's token authentication",
            node_ip,
        )
    return context


@contextlib.contextmanager
def _single_node_cluster() -> Iterator[None]:
    from ray._private import ray_constants

    if not hasattr(ray_constants, "ENABLE_RAY_CLUSTER"):
        yield  # a Ray without the switch: start_loopback_only checks and reports the address it got
        return
    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before


def warn_if_token_readable_by_others() -> None:
    """Ray writes its token file (``~/.ray/auth_token``) with the default umask: other users of the machine
    may read it, and with it run code through this user's Ray."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        logger.warning(
            "init_ray: RAY_AUTH_MODE=disabled: Ray's token authentication is off; any local user (and, with "
            "expose=True, anyone on the network) can run code through this Ray"
        )
        return
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token").absolute()
    try:
        readers = [
            who
            for who, read, search in (("group", stat.S_IRGRP, stat.S_IXGRP), ("other", stat.S_IROTH, stat.S_IXOTH))
            if path.stat().st_mode & read and all(folder.stat().st_mode & search for folder in path.parents)
        ]
    except OSError:
        return  # no token file yet (Ray creates one) or the token comes from RAY_AUTH_TOKEN
    if readers:
        logger.warning(
            "init_ray: Ray's token file %s can be read by %s users; they could use it to run code through this "
            "Ray. Restrict it: chmod 600 %s",
            path,
            " and ".join(readers),
            path,
        )
