"""The platform/plugin/engine report printed by ``python -m verl.core`` and ``verl platforms``."""

from __future__ import annotations

import os

from verl.core.engine import EngineRegistry, RolloutRegistry
from verl.core.platform import PlatformRegistry, select_platform_class
from verl.core.plugins import load_plugins


def platform_report() -> str:
    records = load_plugins()
    lines: list[str] = []
    try:
        selected = select_platform_class()
        forced = os.environ.get("VERL_PLATFORM")
        lines.append(f"selected platform: {selected.name}" + (f" (forced by VERL_PLATFORM={forced})" if forced else ""))
    except Exception as exc:  # report, don't crash: this command is how users debug selection
        lines.append(f"selected platform: none ({exc})")
    lines.append("")
    lines.append("platforms (priority, available, reason):")
    for entry in sorted(PlatformRegistry.entries(), key=lambda e: -e.obj.priority):
        cls = entry.obj
        ok, reason = cls.availability()
        lines.append(
            f"  {cls.name:<10} prio={cls.priority:<5} {'yes' if ok else 'no ':<4} device={cls.device_name} "
            f"vendor={cls.vendor_name} backend={cls.dist_backend}  [{entry.origin}]  {reason}"
        )
    for title, registry in (("training engines", EngineRegistry), ("rollout engines", RolloutRegistry)):
        lines.append("")
        lines.append(f"{title} ({', '.join(registry.keys)}):")
        entries = sorted(registry.entries(), key=lambda e: tuple(str(k) for k in e.key))
        if not entries:
            lines.append("  (none registered)")
        for entry in entries:
            obj = entry.obj
            lines.append(f"  {registry.describe(entry.key):<60} {obj.__module__}.{obj.__qualname__}  [{entry.origin}]")
    lines.append("")
    lines.append("plugins (entry-point groups verl.platforms, verl.plugins):")
    if not records:
        lines.append("  (none)")
    for name, record in sorted(records.items()):
        status = f"FAILED: {record.error}" if record.error else "loaded"
        lines.append(f"  {name:<16} {record.module:<36} [{record.distribution}] {status}")
    return "\n".join(lines)
