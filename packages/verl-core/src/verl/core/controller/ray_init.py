"""Starting Ray (or joining a cluster) the way verl needs it, and the environment workers inherit."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

import ray

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
    node_ip_address: str = "127.0.0.1",
    runtime_env: dict[str, Any] | None = None,
    extra_env_names: Iterable[str] = (),
    **ray_init_kwargs: Any,
) -> Any:
    """Start a local Ray, or join a cluster, with workers inheriting the driver's ``VERL_*`` and ``PYTHONPATH``.

    - ``address`` (the trainer passes ``trainer.ray_address``), else the ``RAY_ADDRESS`` environment
      variable, joins an existing cluster; ``num_cpus``/``num_gpus`` are then the cluster's business and
      must not be given.
    - Otherwise a local Ray starts with ``num_cpus``/``num_gpus`` logical resources (on the CPU platform
      ``num_cpus`` is the number of worker slots, not physical cores), the dashboard off unless
      ``include_dashboard=True`` (it then listens on 127.0.0.1), and ``node_ip_address`` (127.0.0.1) asked
      for as the node address. Ray 2.60 does not honour a loopback node address (it substitutes the
      machine's reachable IP, and its servers listen on all interfaces); what guards a local session
      there is Ray's token authentication, which it enables by default.

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
    return ray.init(
        # "local", not None: None would join a `ray start` cluster found on this machine.
        address="local",
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        include_dashboard=include_dashboard,
        runtime_env=job_runtime_env,
        _node_ip_address=node_ip_address,
        **ray_init_kwargs,
    )
