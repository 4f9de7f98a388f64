"""Dispatch modes: how a driver-side call is split across the ranks of a group and how the per-rank
results are gathered back.

A mode is a registered :class:`DispatchMode`, a (``dispatch_fn``, ``collect_fn``) pair under a name, kept
in :data:`DISPATCH_MODES` (the generic :class:`verl.core.registry.Registry`). Adding a mode is a
registration, never an edit of a switch::

    def dispatch_first_half(layout, args, kwargs):
        ...  # -> Dispatched([RankCall(args_for_rank, kwargs_for_rank), ...], state)

    def collect_sum(layout, state, outputs):
        return sum(o for o in outputs if o is not None)

    register_dispatch_mode("first_half_sum", dispatch_first_half, collect_sum)
    # now usable as @register(dispatch_mode=Dispatch.FIRST_HALF_SUM) (or the string "first_half_sum")

``dispatch_fn(layout, args, kwargs)`` runs on the driver and returns one :class:`RankCall` per rank in
``layout.ranks``; values in a call may be Ray ``ObjectRef``\\ s (Ray resolves top-level arguments on the
worker). ``collect_fn(layout, state, outputs)`` receives the per-rank return values (``None`` for ranks whose
call had ``return_output=False``) and the ``state`` the dispatch returned; it runs on the driver for a
blocking call, or in a small Ray task when a pending result is handed to a later call (so it must be a
picklable function).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from verl.core.registry import Registry

#: How a later call may consume a pending result piece by piece instead of materializing it whole:
#: - ``"per_rank"``: the collected value is the list of every called rank's output, in rank order;
#: - ``"single"``: the collected value is the first called rank's output;
#: - ``"dp_shards"``: the collected value joins one DataProto shard per data-parallel rank (the state is the
#:   shard layouts, see :mod:`verl.core.controller.dp_shards`);
#: - ``"opaque"``: anything else; a later call gets it materialized by a small Ray task.
OUTPUT_LAYOUTS = ("per_rank", "single", "dp_shards", "opaque")


@dataclass(frozen=True)
class DPCoordinates:
    """The data-parallel coordinates of a layout's ranks; the tuples are aligned with its ``ranks``."""

    #: Data-parallel rank of each called rank.
    ranks: tuple[int, ...]
    size: int
    #: Whether each called rank is the one collected for its data-parallel rank.
    collect: tuple[bool, ...]


@dataclass(frozen=True)
class GroupLayout:
    """The ranks one call runs on, and (for data-parallel modes) their data-parallel coordinates.

    Per-rank tuples are aligned with ``ranks``; for ``Execute.ALL`` that is ``0 .. world_size - 1``, for
    ``Execute.RANK_ZERO`` just ``(0,)`` (a world of one, with ``dp_size == 1``). The data-parallel fields are
    all set or all None; read them through :meth:`data_parallel`, which says so when they are absent.
    """

    ranks: tuple[int, ...]
    #: Data-parallel rank of each called rank; None when the mode did not ask for the dp layout.
    dp_ranks: tuple[int, ...] | None = None
    dp_size: int | None = None
    #: Whether each called rank is the one collected for its data-parallel rank.
    collect: tuple[bool, ...] | None = None

    def __post_init__(self) -> None:
        given = [f for f in (self.dp_ranks, self.dp_size, self.collect) if f is not None]
        if given and len(given) != 3:
            raise ValueError(f"GroupLayout: dp_ranks, dp_size and collect go together (all or none), got {self}")
        if self.dp_ranks is not None and self.collect is not None:
            if not len(self.dp_ranks) == len(self.collect) == len(self.ranks):
                raise ValueError(f"GroupLayout: dp_ranks and collect need one entry per rank of {self.ranks}")

    def __len__(self) -> int:
        return len(self.ranks)

    def data_parallel(self) -> DPCoordinates:
        """The data-parallel coordinates of the ranks; an error when the dispatch mode did not ask for them."""
        if self.dp_ranks is None or self.dp_size is None or self.collect is None:
            raise ValueError("this dispatch mode did not ask for the data-parallel layout (needs_dp_layout=False)")
        return DPCoordinates(self.dp_ranks, self.dp_size, self.collect)

    def members_of(self, dp_rank: int) -> list[int]:
        """Positions (in ``ranks``) of the ranks that hold data-parallel rank ``dp_rank``."""
        return [i for i, d in enumerate(self.data_parallel().ranks) if d == dp_rank]

    def collect_position(self, dp_rank: int) -> int:
        """Position (in ``ranks``) of the rank whose output is collected for ``dp_rank``."""
        dp = self.data_parallel()
        for i, (d, c) in enumerate(zip(dp.ranks, dp.collect)):
            if d == dp_rank and c:
                return i
        raise ValueError(f"no collect rank for data-parallel rank {dp_rank} in {self}")


@dataclass
class RankCall:
    """What one rank is called with."""

    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: False: the rank runs the method but returns None (its output is not collected; saves transfers).
    return_output: bool = True


@dataclass
class Dispatched:
    """A dispatch function's answer: one call per rank of the layout, plus state handed to the collect."""

    calls: list[RankCall]
    state: Any = None


DispatchFn = Callable[[GroupLayout, tuple, dict], Dispatched]
CollectFn = Callable[[GroupLayout, Any, list], Any]


@dataclass(frozen=True)
class DispatchMode:
    name: str
    dispatch_fn: DispatchFn
    collect_fn: CollectFn
    #: Ask the workers for their data-parallel coordinates (cached per role) before dispatching.
    needs_dp_layout: bool = False
    #: One of :data:`OUTPUT_LAYOUTS`: lets a later call take a pending result apart without materializing.
    output_layout: str = "opaque"

    def __post_init__(self) -> None:
        if self.output_layout not in OUTPUT_LAYOUTS:
            raise ValueError(f"dispatch mode {self.name!r}: output_layout must be one of {OUTPUT_LAYOUTS}")


#: Every dispatch mode by name. Register through :func:`register_dispatch_mode`.
DISPATCH_MODES: Registry[DispatchMode] = Registry("dispatch mode", keys=("name",))


def register_dispatch_mode(
    name: str,
    dispatch_fn: DispatchFn,
    collect_fn: CollectFn,
    *,
    needs_dp_layout: bool = False,
    output_layout: str = "opaque",
    override: bool = False,
) -> DispatchMode:
    """Register a dispatch mode under ``name`` (lower case); it becomes ``Dispatch.<NAME>``."""
    if not name or name != name.lower() or not name.isidentifier():
        raise ValueError(f"dispatch mode names are lower-case identifiers (they become Dispatch.<NAME>), got {name!r}")
    mode = DispatchMode(name, dispatch_fn, collect_fn, needs_dp_layout, output_layout)
    DISPATCH_MODES.register(name, override=override)(mode)
    return mode


def get_dispatch_mode(name: str) -> DispatchMode:
    return DISPATCH_MODES.get(str(name))


class _DispatchNamespace(type):
    """``Dispatch.NAME`` is the registered mode ``"name"``: modes registered later are members too."""

    def __getattr__(cls, attr: str) -> str:
        if attr.isupper() and attr.lower() in DISPATCH_MODES:
            return attr.lower()
        raise AttributeError(
            f"Dispatch has no mode {attr!r}; registered modes: "
            f"{', '.join(sorted(n.upper() for n in DISPATCH_MODES.names()))}"
        )

    def __iter__(cls):
        return iter(sorted(DISPATCH_MODES.names()))


class Dispatch(metaclass=_DispatchNamespace):
    """Names of the dispatch modes (plain strings, so a mode is also selectable by its name).

    - ``ONE_TO_ALL``: every rank gets the same arguments; returns the list of all ranks' outputs.
    - ``ALL_TO_ALL``: each argument is a list with one entry per rank; returns the list of outputs.
    - ``RANK_ZERO``: every rank runs with the same arguments (so collectives work); returns rank 0's output.
    - ``DP_COMPUTE_PROTO``: each DataProto argument is padded to a multiple of the data-parallel size and
      split by data-parallel rank (every rank of a model-parallel group gets its group's shard); the collect
      rank of each group returns a DataProto; results are concatenated in order with the padding removed.
    - ``DP_COMPUTE_METRIC``: split like ``DP_COMPUTE_PROTO``; returns the list of the collect ranks' outputs
      (one per data-parallel rank, e.g. metric dicts), padding rows included in what each rank saw.
    """

    ONE_TO_ALL = "one_to_all"
    ALL_TO_ALL = "all_to_all"
    RANK_ZERO = "rank_zero"
    DP_COMPUTE_PROTO = "dp_compute_proto"
    DP_COMPUTE_METRIC = "dp_compute_metric"
