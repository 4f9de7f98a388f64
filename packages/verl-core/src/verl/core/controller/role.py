"""The driver's view of one role of a worker group: ``RoleHandle`` holds the role's registered methods
(``GroupMethod``) and its data-parallel layout, and turns a method call into one Ray call per rank.
"""

from __future__ import annotations

from typing import Any, Protocol

from verl.core.controller.decorator import Execute, MethodSpec, registered_methods
from verl.core.controller.dispatch import DispatchMode, GroupLayout, get_dispatch_mode
from verl.core.controller.errors import RankSite, wait_for
from verl.core.controller.futures import GroupFuture
from verl.core.controller.host import CallHeader, WorkerSpec
from verl.core.controller.worker import DPInfo

# Instance attributes: a registered method of the same name would hide them.
ROLE_RESERVED = frozenset({"name", "worker_cls", "methods"})


class GroupRuntime(Protocol):
    """What a role needs of the group that runs it (``WorkerGroup`` provides it): its rank processes, where
    they run, its call timeout, and whether it is still alive."""

    call_timeout_s: float | None

    @property
    def world_size(self) -> int: ...

    @property
    def actors(self) -> list[Any]: ...

    @property
    def rank_infos(self) -> list[dict[str, Any]]: ...

    def check_alive(self) -> None: ...


class GroupMethod:
    """A registered worker method as seen from the driver."""

    def __init__(self, role: RoleHandle, name: str, spec: MethodSpec, doc: str | None):
        self._role = role
        self.name = name
        self.spec = spec
        self.__doc__ = doc

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Blocking methods return the collected result; ``blocking=False`` ones a :class:`GroupFuture`."""
        return self._role._call(self.name, self.spec, args, kwargs, blocking=self.spec.blocking)

    def submit(self, *args: Any, **kwargs: Any) -> GroupFuture:
        """Call without waiting, whatever the method's ``blocking`` flag says."""
        return self._role._call(self.name, self.spec, args, kwargs, blocking=False)

    def __repr__(self) -> str:
        return f"<{self._role.name}.{self.name} {self.spec.dispatch_mode} {self.spec.execute_mode.value}>"


class RoleHandle:
    """One role of a group: its registered methods, and its data-parallel layout (cached)."""

    def __init__(self, group: GroupRuntime, name: str, spec: WorkerSpec):
        self._group = group
        self.name = name
        self.worker_cls = spec.cls
        self._dp_layout: GroupLayout | None = None
        self.methods: dict[str, GroupMethod] = {}
        for method, mspec in registered_methods(spec.cls).items():
            if method in ROLE_RESERVED or hasattr(RoleHandle, method):
                raise ValueError(
                    f"{spec.cls.__qualname__}.{method} is registered but its name is taken by the group API "
                    f"(RoleHandle.{method}); rename the method"
                )
            bound = GroupMethod(self, method, mspec, getattr(spec.cls, method).__doc__)
            self.methods[method] = bound
            setattr(self, method, bound)

    @property
    def world_size(self) -> int:
        return self._group.world_size

    @property
    def sites(self) -> list[RankSite]:
        return [RankSite.from_info(self.name, r, info) for r, info in enumerate(self._group.rank_infos)]

    # -- layout ---------------------------------------------------------------------------------------
    def dp_layout(self) -> GroupLayout:
        """Every rank's data-parallel coordinates for this role (asked once, then cached)."""
        if self._dp_layout is None:
            refs = [h.dp_info.remote(self.name) for h in self._group.actors]
            infos: list[DPInfo] = wait_for(refs, self.sites, f"{self.name}.dp_info", self._group.call_timeout_s)
            self._dp_layout = validated_dp_layout(self.name, infos)
        return self._dp_layout

    def refresh_dp_layout(self) -> None:
        """Forget the cached layout (after the workers changed it with ``set_dp_info``)."""
        self._dp_layout = None

    def _layout(self, mode: DispatchMode, execute: Execute) -> GroupLayout:
        if execute is Execute.RANK_ZERO:  # a world of one
            return GroupLayout((0,), (0,), 1, (True,)) if mode.needs_dp_layout else GroupLayout((0,))
        if mode.needs_dp_layout:
            return self.dp_layout()
        return GroupLayout(tuple(range(self.world_size)))

    # -- calls ----------------------------------------------------------------------------------------
    def _call(self, method: str, spec: MethodSpec, args: tuple, kwargs: dict, blocking: bool) -> Any:
        group = self._group
        group.check_alive()
        actors = group.actors
        mode = get_dispatch_mode(spec.dispatch_mode)
        layout = self._layout(mode, spec.execute_mode)
        dispatched = mode.dispatch_fn(layout, args, kwargs)
        if len(dispatched.calls) != len(layout):
            raise RuntimeError(
                f"dispatch mode {mode.name!r} returned {len(dispatched.calls)} calls for {len(layout)} ranks"
            )
        # Each rank checks that the coordinates it was split for are still its own.
        dp = layout.data_parallel() if mode.needs_dp_layout and spec.execute_mode is Execute.ALL else None
        refs = []
        for pos, call in enumerate(dispatched.calls):
            rank = layout.ranks[pos]
            expected = None if dp is None else DPInfo(dp.ranks[pos], dp.size, dp.collect[pos])
            header = CallHeader(self.name, method, call.return_output, expected)
            refs.append(actors[rank].execute.remote(header, *call.args, **call.kwargs))
        sites = self.sites
        future = GroupFuture(
            mode=mode,
            layout=layout,
            refs=refs,
            state=dispatched.state,
            sites=[sites[r] for r in layout.ranks],
            method=f"{self.name}.{method}",
            timeout_s=group.call_timeout_s,
        )
        return future.get() if blocking else future

    def __repr__(self) -> str:
        return f"<role {self.name!r} ({self.worker_cls.__qualname__}) methods={sorted(self.methods)}>"


def validated_dp_layout(role: str, infos: list[DPInfo]) -> GroupLayout:
    sizes = {i.dp_size for i in infos}
    if len(sizes) != 1:
        raise ValueError(f"role {role!r}: ranks disagree on the data-parallel size: {[i.dp_size for i in infos]}")
    dp_size = sizes.pop()
    for d in range(dp_size):
        members = [r for r, i in enumerate(infos) if i.dp_rank == d]
        collectors = [r for r in members if infos[r].is_collect]
        if len(collectors) != 1:
            raise ValueError(
                f"role {role!r}: data-parallel rank {d} must have exactly one collect rank among its ranks "
                f"{members}, found {collectors or 'none'}; check the is_collect flags given to set_dp_info"
            )
    return GroupLayout(
        ranks=tuple(range(len(infos))),
        dp_ranks=tuple(i.dp_rank for i in infos),
        dp_size=dp_size,
        collect=tuple(i.is_collect for i in infos),
    )
