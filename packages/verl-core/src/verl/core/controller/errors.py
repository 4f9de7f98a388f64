"""What the driver raises when a worker group call goes wrong, and the wait that never hangs.

Every error names the role, the rank and where it ran (node IP, node id, pid), so a failure in a
128-process job points at one process:

- :class:`WorkerCallError`: the method raised on a rank; carries the remote traceback and, as
  ``__cause__``, the original exception when Ray could rebuild it.
- :class:`WorkerDiedError`: the rank's process is gone (killed, crashed, out of memory, node lost); the
  message says why as far as Ray and the node's kernel tell (see :mod:`~verl.core.controller.death_cause`).
- :class:`WorkerTimeoutError`: no answer within the group's ``call_timeout_s`` (a hung collective, a
  silently lost node).

The first failing rank is reported as soon as it fails: the others may be blocked in a collective with
it and would never answer, so the driver does not wait for them.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import (
    NodeDiedError,
    OutOfMemoryError,
    RayActorError,
    RayError,
    RayTaskError,
    WorkerCrashedError,
)

from verl.core.controller.death_cause import VANISHED, describe_death, kernel_oom_evidence, process_gone

_REMOTE_PROCESS = re.compile(r"\(pid=(\d+), ip=([^,)]+)")


@dataclass(frozen=True)
class RankSite:
    """Where one rank of one role runs."""

    role: str
    rank: int
    node_ip: str = "?"
    node_id: str = "?"
    pid: int | None = None
    #: The node's kernel OOM-kill count when the rank started (None: unknown), to tell an OOM kill later.
    oom_kills_at_start: int | None = None

    @classmethod
    def from_info(cls, role: str, rank: int, info: dict[str, Any]) -> RankSite:
        """From what a rank's host reported about itself (``WorkerHost.describe``)."""
        return cls(role, rank, info["node_ip"], info["node_id"], info["pid"], info.get("oom_kills"))

    def describe(self) -> str:
        node_id = self.node_id[:12] if self.node_id != "?" else "?"
        return f"role {self.role!r} rank {self.rank} (node {self.node_ip}, node id {node_id}, pid {self.pid})"


class WorkerGroupError(RuntimeError):
    """Base of the controller's errors about a group's ranks."""

    def __init__(self, message: str, site: RankSite | None = None, method: str | None = None):
        super().__init__(message)
        self.site = site
        self.method = method

    @property
    def role(self) -> str | None:
        return None if self.site is None else self.site.role

    @property
    def rank(self) -> int | None:
        return None if self.site is None else self.site.rank


class WorkerCallError(WorkerGroupError):
    """A registered method raised on a rank."""

    def __init__(self, site: RankSite, method: str, remote_traceback: str):
        super().__init__(f"{method} failed on {site.describe()}:\n{remote_traceback}", site, method)
        self.remote_traceback = remote_traceback


class WorkerDiedError(WorkerGroupError):
    """The process of a rank is gone. ``detail`` says why; ``ray_error`` is what Ray raised (if anything)."""

    def __init__(self, site: RankSite, method: str, detail: str, ray_error: RayError | None = None):
        super().__init__(f"{method}: {site.describe()} is dead: {detail}", site, method)
        self.detail = detail
        self.ray_error = ray_error


class WorkerTimeoutError(WorkerGroupError, TimeoutError):
    """Ranks did not answer within the timeout."""

    def __init__(self, sites: Sequence[RankSite], method: str, timeout_s: float):
        pending = "; ".join(s.describe() for s in sites)
        super().__init__(
            f"{method}: no answer within {timeout_s:g} s from {len(sites)} rank(s): {pending}. They may be hung "
            "(e.g. in a collective with a failed rank) or their node may be lost; raise call_timeout_s if the "
            "work legitimately takes longer",
            sites[0] if sites else None,
            method,
        )
        self.sites = list(sites)


def _as_group_error(exc: RayError, site: RankSite, method: str) -> tuple[WorkerGroupError, BaseException | None]:
    """The controller's error for a Ray error, and the original exception to chain it to (if any)."""
    if isinstance(exc, (RayActorError, WorkerCrashedError, OutOfMemoryError, NodeDiedError)):
        death = describe_death(exc)
        why = death.cause
        if not death.explained and _gone_from_this_node(site):
            why = f"{VANISHED} [Ray: {death.cause}]"
        detail = why + (kernel_oom_evidence(site.node_id, site.oom_kills_at_start) if death.silent else "")
        return WorkerDiedError(site, method, detail, ray_error=exc), None
    if isinstance(exc, RayTaskError):
        # What ray.get raises is a "dual" exception proxying attributes to the cause; its str() is Ray's
        # formatted remote traceback, headed by "ray::<task>() (pid=..., ip=...)".
        tb = str(exc)
        origin = ""
        where = _REMOTE_PROCESS.search(tb)
        if site.pid is not None and where and int(where.group(1)) != site.pid:
            # The failure happened upstream (an argument produced by another call failed).
            origin = f"(raised in pid {where.group(1)} on {where.group(2)}, while producing an argument of this call)\n"
        cause = exc.cause if isinstance(exc.cause, BaseException) else None
        return WorkerCallError(site, method, origin + tb), cause
    return WorkerGroupError(f"{method} failed on {site.describe()}: {type(exc).__name__}: {exc}", site, method), None


def wait_for(
    refs: Sequence[ray.ObjectRef], sites: Sequence[RankSite], method: str, timeout_s: float | None
) -> list[Any]:
    """Values of ``refs`` (one per rank, aligned with ``sites``). Raises the first failure as soon as it is
    known, or :class:`WorkerTimeoutError` after ``timeout_s`` (None: no limit, deaths are still reported)."""
    values: list[Any] = [None] * len(refs)
    position = {ref: i for i, ref in enumerate(refs)}
    pending = list(refs)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while pending:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, pending = ray.wait(pending, num_returns=1, timeout=remaining)
        if not ready and timeout_s is not None:  # without a timeout, ray.wait returns only with a ready ref
            raise WorkerTimeoutError([sites[position[r]] for r in pending], method, timeout_s)
        for ref in ready:
            i = position[ref]
            try:
                values[i] = ray.get(ref)
            except RayError as exc:
                error, cause = _as_group_error(exc, sites[i], method)
                if not isinstance(error, WorkerDiedError):
                    # A rank that dies mid-collective makes its peers fail too ("connection closed by
                    # peer"), sometimes before Ray reports the death: report the death, the root cause.
                    died = _death_among(pending, position, sites, method)
                    if died is not None:
                        raise died from error
                raise error from cause
    return values


#: How long a call error waits to see whether another rank of the call died (the likely root cause).
DEATH_GRACE_S = 5.0
#: How long it waits for Ray's word on a rank whose process is already gone from this node (Ray notices a
#: vanished worker later than its peers' collectives do, more so on a busy machine).
DEATH_REPORT_S = 60.0


def _gone_from_this_node(site: RankSite) -> bool:
    """Whether the rank ran on the driver's node and its process has ended (unknown elsewhere: False)."""
    if site.pid is None or site.node_id != ray.get_runtime_context().get_node_id():
        return False
    return process_gone(site.pid)


def _death_among(
    pending: Sequence[ray.ObjectRef], position: dict, sites: Sequence[RankSite], method: str
) -> WorkerDiedError | None:
    """The death of a rank among ``pending``, as Ray reports it within the grace period. A rank whose
    process has already vanished from this node is waited for longer, and reported as vanished even if
    Ray stays silent."""
    if not pending:
        return None
    vanished = [ref for ref in pending if _gone_from_this_node(sites[position[ref]])]
    grace = DEATH_REPORT_S if vanished else DEATH_GRACE_S
    watched = vanished or list(pending)
    ready, _ = ray.wait(watched, num_returns=len(watched), timeout=grace)
    for ref in ready:
        try:
            ray.get(ref)
        except RayError as exc:
            error, _ = _as_group_error(exc, sites[position[ref]], method)
            if isinstance(error, WorkerDiedError):
                return error
    if vanished:
        site = sites[position[vanished[0]]]
        detail = VANISHED + kernel_oom_evidence(site.node_id, site.oom_kills_at_start)
        return WorkerDiedError(site, method, detail + f" (Ray had not reported it within {grace:g} s)")
    return None
