"""``PlatformRegistry`` and ``get_platform()``: which hardware this process runs on."""

from __future__ import annotations

import logging
import os
import threading

from verl.core.registry import Registry, RegistryError

logger = logging.getLogger(__name__)


class _PlatformRegistry(Registry):
    """A registry keyed by platform name that also stamps the name on the class."""

    def register(self, *args, override: bool = False, **key):
        decorator = super().register(*args, override=override, **key)
        name = args[0] if args else key.get("platform")
        if not isinstance(name, str):
            raise TypeError("a platform registers under one name: PlatformRegistry.register(platform='name')")

        def wrap(cls):
            cls.name = name
            return decorator(cls)

        return wrap


#: ``@PlatformRegistry.register(platform="name")`` registers a :class:`PlatformBase` subclass.
PlatformRegistry = _PlatformRegistry("platform", keys=("platform",))

_selected = None
_lock = threading.Lock()


class PlatformNotAvailableError(RuntimeError):
    pass


def platform_names() -> list[str]:
    return sorted(PlatformRegistry.names())


def get_platform_class(name: str):
    from verl.core.plugins import load_platform_plugins

    load_platform_plugins()
    try:
        return PlatformRegistry.get(platform=name)
    except RegistryError as e:
        raise RegistryError(f"VERL_PLATFORM={name!r} is not a registered platform. {e}") from None


def select_platform_class(name: str | None = None):
    """The platform class to use: ``name`` or ``VERL_PLATFORM`` when given, else the available one
    with the highest priority (CPU last)."""
    from verl.core.plugins import load_platform_plugins

    load_platform_plugins()
    forced = name or os.environ.get("VERL_PLATFORM", "").strip() or None
    if forced:
        cls = get_platform_class(forced)
        ok, reason = cls.availability()
        if not ok:
            raise PlatformNotAvailableError(
                f"VERL_PLATFORM={forced!r} was requested but is not available here: {reason}. "
                f"Unset VERL_PLATFORM to auto-detect, or pick one of: {', '.join(platform_names())}."
            )
        return cls
    candidates = sorted((e.obj for e in PlatformRegistry.entries()), key=lambda c: c.priority, reverse=True)
    for cls in candidates:
        ok, _ = cls.availability()
        if ok:
            return cls
    raise PlatformNotAvailableError("no platform is available, not even cpu; is verl-core installed correctly?")


def get_platform():
    """The platform this process uses (selected once, then cached)."""
    global _selected
    if _selected is None:
        with _lock:
            if _selected is None:
                cls = select_platform_class()
                _selected = cls()
                logger.debug("verl platform: %r", _selected)
    return _selected


def reset_platform() -> None:
    """Forget the cached selection (tests, or after changing VERL_PLATFORM)."""
    global _selected
    with _lock:
        _selected = None
