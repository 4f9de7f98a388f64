"""Plugin discovery: pluggy over the ``verl.plugins`` entry-point group.

Loading a plugin imports its module; the module's decorators register platforms and engines, and any
``@hookimpl`` functions it defines are registered with the plugin manager. The platform packages of this
repository load through exactly this path, like any third-party vendor's package.

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


def load_plugins(force: bool = False) -> dict[str, PluginRecord]:
    """Import every plugin once per process. Returns the records by name (errors included)."""
    global _loaded
    with _lock:
        if _loaded and not force:
            return dict(_records)
        _loaded = True  # set first: a plugin importing verl.core must not recurse into loading
        # The built-in CPU platform registers on import of verl.core.platform.
        importlib.import_module("verl.core.platform")
        plugins = [
            (ep, ep.dist.name if ep.dist is not None else "<unknown>") for ep in entry_points(group=ENTRY_POINT_GROUP)
        ]
        # Declare every plugin's module before importing any: plugins import each other's modules.
        for ep, dist in plugins:
            declare_module_origin(ep.module, dist)
        for ep, dist in plugins:
            if ep.name in _records and not force:
                continue
            _import(ep.name, ep.module, dist)
        for module_name in _external_modules():
            if module_name not in _records or force:
                _import(module_name, module_name, "<external>")
        return dict(_records)


def _external_modules() -> list[str]:
    raw = os.environ.get(EXTERNAL_MODULES_ENV, "")
    return [m.strip() for m in raw.split(",") if m.strip()]


def plugin_records() -> dict[str, PluginRecord]:
    return dict(_records)


def failed_plugins() -> dict[str, PluginRecord]:
    return {n: r for n, r in _records.items() if r.error}
