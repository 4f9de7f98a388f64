"""``@register``: marks a worker method as callable from the driver through its worker group."""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from verl.core.controller.dispatch import DISPATCH_MODES, Dispatch
from verl.core.registry import RegistryError

F = TypeVar("F", bound=Callable[..., Any])

#: Attribute under which ``register`` stores its :class:`MethodSpec` on the function.
REGISTER_ATTR = "__verl_register__"


class Execute(str, enum.Enum):
    """Which ranks run a call."""

    #: Every rank (SPMD: the method may run collectives).
    ALL = "all"
    #: Only rank 0, as a world of one (no collectives with the other ranks).
    RANK_ZERO = "rank_zero"


@dataclass(frozen=True)
class MethodSpec:
    dispatch_mode: str
    execute_mode: Execute
    blocking: bool


def register(
    dispatch_mode: str = Dispatch.ALL_TO_ALL,
    execute_mode: Execute | str = Execute.ALL,
    blocking: bool = True,
) -> Callable[[F], F]:
    """Expose a :class:`~verl.core.controller.Worker` method on the driver as ``group.<method>``.

    ``dispatch_mode`` names a registered dispatch mode (``Dispatch.DP_COMPUTE_PROTO`` ...), which says how
    the driver's arguments are split across the ranks and how their results are gathered. With
    ``blocking=False`` the group method returns a :class:`~verl.core.controller.GroupFuture` at once; the
    future can be passed to a later call without coming back through the driver.

    A subclass that overrides a registered method without decorating it keeps the registration.
    """
    if callable(dispatch_mode) and not isinstance(dispatch_mode, str):
        raise TypeError("register takes arguments: use @register(dispatch_mode=Dispatch.X), not a bare @register")
    mode = str(dispatch_mode)
    try:
        DISPATCH_MODES.get(mode)
    except RegistryError as exc:
        raise ValueError(f"register: unknown dispatch_mode {mode!r}. {exc}") from None
    spec = MethodSpec(mode, Execute(execute_mode), bool(blocking))

    def decorator(fn: F) -> F:
        if inspect.iscoroutinefunction(fn):
            raise TypeError(
                f"register: {fn.__qualname__} is async; worker group methods run synchronously in the worker "
                "(run the coroutine with asyncio inside a plain method)"
            )
        setattr(fn, REGISTER_ATTR, spec)
        return fn

    return decorator


def registered_methods(cls: type) -> dict[str, MethodSpec]:
    """Every method of ``cls`` (or a base class) marked with :func:`register`, by name."""
    found: dict[str, MethodSpec] = {}
    for klass in reversed(cls.__mro__):  # bases first, so subclasses decorating again win
        for name, attr in vars(klass).items():
            target = attr.__func__ if isinstance(attr, (staticmethod, classmethod)) else attr
            spec = getattr(target, REGISTER_ATTR, None)
            if isinstance(spec, MethodSpec):
                found[name] = spec
    return found
