"""``GroupFuture``: the pending result of a non-blocking group call.

``future.get()`` waits (with the group's failure reporting) and collects on the driver. Handed to a later
call as an argument, a future never travels through the driver:

- the same layout on both sides is passed piece by piece: an ``ALL_TO_ALL``/``ONE_TO_ALL`` result feeds an
  ``ALL_TO_ALL`` call rank to rank, and a ``DP_COMPUTE_PROTO`` result feeds a data-parallel call of the same
  data-parallel size shard to shard (each rank's Ray ObjectRef goes straight to the matching rank, and Ray
  resolves it in that worker);
- anything else is materialized by a small Ray task that runs the producer's collect function next to the
  data (:mod:`verl.core.controller.remote_ops`); a data-parallel consumer then has that result split by
  another task into one shard per data-parallel rank, so each rank fetches only its own shard.

Only top-level arguments are looked at: a future inside a list or dict is not resolved.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

import ray

from verl.core.controller.dispatch import DispatchMode, GroupLayout
from verl.core.controller.errors import RankSite, wait_for
from verl.core.controller.remote_ops import materialize, resolve_state


class _Timeout(enum.Enum):
    """``get()``'s default timeout: the group's call timeout (None already means no limit)."""

    GROUP = "the group's call_timeout_s"


class GroupFuture:
    """One pending call of a worker group: one ObjectRef per called rank, and how to collect them."""

    def __init__(
        self,
        *,
        mode: DispatchMode,
        layout: GroupLayout,
        refs: Sequence[ray.ObjectRef],
        state: Any,
        sites: Sequence[RankSite],
        method: str,
        timeout_s: float | None,
    ):
        self.mode = mode
        self.layout = layout
        self.refs = list(refs)
        self.state = state
        self.sites = list(sites)
        self.method = method
        self.timeout_s = timeout_s
        self._materialized: ray.ObjectRef | None = None

    def get(self, timeout_s: float | None | _Timeout = _Timeout.GROUP) -> Any:
        """Wait for every rank and return the collected result (what a blocking call returns)."""
        timeout = self.timeout_s if timeout_s is _Timeout.GROUP else timeout_s
        outputs = wait_for(self.refs, self.sites, self.method, timeout)
        return self.mode.collect_fn(self.layout, resolve_state(self.state), outputs)

    def done(self) -> bool:
        """True when every rank has finished (successfully or not); never blocks."""
        ready, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=0, fetch_local=False)
        return len(ready) == len(self.refs)

    # -- handing the result to a later call ---------------------------------------------------------
    def as_ref(self) -> ray.ObjectRef:
        """One ObjectRef holding the collected result, computed remotely (once) when it must be."""
        if self.mode.output_layout == "single":
            return self.refs[0]
        if self._materialized is None:
            self._materialized = materialize.remote(self.mode, self.layout, self.state, *self.refs)
        return self._materialized

    def per_rank_refs(self, n: int) -> list[ray.ObjectRef] | None:
        """The per-rank output refs when the result is a per-rank list of ``n`` items, else None."""
        if self.mode.output_layout == "per_rank" and len(self.refs) == n:
            return list(self.refs)
        return None

    def dp_shard_refs(self, dp_size: int) -> tuple[list[ray.ObjectRef], Any] | None:
        """(one output ref per data-parallel rank, their shard layout) when the result is a DataProto
        sharded over ``dp_size`` data-parallel ranks, else None."""
        if self.mode.output_layout != "dp_shards" or self.layout.dp_size != dp_size:
            return None
        shards = [self.refs[self.layout.collect_position(d)] for d in range(dp_size)]
        layouts = self.state if isinstance(self.state, (list, tuple)) else [self.state]
        return shards, (layouts[0] if layouts else None)

    def __repr__(self) -> str:
        return f"GroupFuture({self.method}, mode={self.mode.name}, ranks={len(self.refs)}, done={self.done()})"
