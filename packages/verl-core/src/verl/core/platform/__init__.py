"""Platforms: ``PlatformBase``, ``PlatformRegistry``, ``get_platform()`` and the built-in CPU platform."""

from verl.core.platform.base import PlatformBase
from verl.core.platform.cpu import CPUPlatform  # importing it registers "cpu"
from verl.core.platform.registry import (
    PlatformNotAvailableError,
    PlatformRegistry,
    get_platform,
    platform_names,
    reset_platform,
    select_platform_class,
)

__all__ = [
    "CPUPlatform",
    "PlatformBase",
    "PlatformNotAvailableError",
    "PlatformRegistry",
    "get_platform",
    "platform_names",
    "reset_platform",
    "select_platform_class",
]
