"""Plugin discovery: pluggy over two entry-point groups.

- ``verl.platforms``: modules that register platforms. A platform lookup (``get_platform()``) loads only
  these, so choosing a device never imports engines, models or algorithms.
- ``verl.plugins``: everything else (engines, rollout engines, estimators, trackers, ...), loaded with the
  platforms by :func:`load_plugins` (at start-up, and before names are looked up in a registry).

Loading a plugin imports its module; the module's decorators register what it provides, and any
``@hookimpl`` functions it defines are registered with the plugin manager. The platform and engine
packages of this repository load through exactly this path, like any third-party vendor's package.

``VERL_USE_EXTERNAL_MODULES=mod1,mod2`` imports extra modules without installing them (development).
A plugin that fails to import is reported once, by name with its error, and the others still load.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import traceback
from dataclasses import dataclass
from importlib.metadata import entry_points

import pluggy

from verl.core import hookspecs
from verl.core.registry import declare_module_origin, registering_as

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "verl.plugins"
PLATFORM_GROUP = "verl.platforms"
EXTERNAL_MODULES_ENV = "VERL_USE_EXTERNAL_MODULES"

hookimpl = pluggy.HookimplMarker("verl")


@dataclass(frozen=True)
class PluginRecord:
    name: str  # entry-point name, or the module name for external modules
    module: str
    distribution: str  # distribution that declared it ("<external>" for VERL_USE_EXTERNAL_MODULES)
    error: str | None = None  # "ExcType: message" when the import failed
    traceback: str | None = None


_manager: pluggy.PluginManager | None = None
_records: dict[str, PluginRecord] = {}
_loaded = False
_platforms_loaded = False
_lock = threading.RLock()


def plugin_manager() -> pluggy.PluginManager:
    global _manager
    if _manager is None:
        _manager = pluggy.PluginManager("verl")
        _manager.add_hookspecs(hookspecs)
    return _manager


def _import(name: str, module_name: str, distribution: str) -> None:
    try:
        with registering_as(distribution):
            module = importlib.import_module(module_name)
        pm = plugin_manager()
        if not pm.is_registered(module):
            pm.register(module, name=name)
        _records[name] = PluginRecord(name, module_name, distribution)
    except Exception as exc:  # a broken plugin must not take the others down
        record = PluginRecord(
            name,
            module_name,
            distribution,
            error=f"{type(exc).__name__}: {exc}",
            traceback=traceback.format_exc(),
        )
        _records[name] = record
        logger.warning(
            "verl plugin %r (module %s, from %s) failed to load and is skipped: %s",
            name,
            module_name,
            distribution,
            record.error,
        )


def _load_group(group: str, force: bool) -> None:
    plugins = [(ep, ep.dist.name if ep.dist is not None else "<unknown>") for ep in entry_points(group=group)]
    # Declare every plugin's module before importing any: plugins import each other's modules.
    for ep, dist in plugins:
        declare_module_origin(ep.module, dist)
    for ep, dist in plugins:
        name = ep.name
        known = _records.get(name)
        if known is not None and known.module == ep.module and not force:  # one module listed in both groups
            continue
        if known is not None and known.module != ep.module:  # same name, another module: keep both records
            name = f"{ep.name} ({group})"
        _import(name, ep.module, dist)


def load_platform_plugins(force: bool = False) -> dict[str, PluginRecord]:
    """Import the ``verl.platforms`` plugins once per process (what a platform lookup needs)."""
    global _platforms_loaded
    with _lock:
        if not _platforms_loaded or force:
            _platforms_loaded = True  # set first: a plugin importing verl.core must not recurse into loading
            _load_group(PLATFORM_GROUP, force)
            # Asked for by name (development), so imported whatever they register: one may be a platform.
            for module_name in _external_modules():
                if module_name not in _records or force:
                    _import(module_name, module_name, "<external>")
        return dict(_records)


def load_plugins(force: bool = False) -> dict[str, PluginRecord]:
    """Import every plugin (both groups) once per process. Returns the records by name (errors included)."""
    global _loaded
    with _lock:
        if _loaded and not force:
            return dict(_records)
        _loaded = True
        load_platform_plugins(force)
        _load_group(ENTRY_POINT_GROUP, force)
        return dict(_records)


def _external_modules() -> list[str]:
    raw = os.environ.get(EXTERNAL_MODULES_ENV, "")
    return [m.strip() for m in raw.split(",") if m.strip()]


def plugin_records() -> dict[str, PluginRecord]:
    return dict(_records)


def failed_plugins() -> dict[str, PluginRecord]:
    return {n: r for n, r in _records.items() if r.error}
