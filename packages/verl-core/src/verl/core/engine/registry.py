"""``EngineRegistry`` (training engines) and ``RolloutRegistry`` (rollout engines).

Both are the generic :class:`~verl.core.registry.Registry` keyed additionally by device and vendor.
Lookup tries the exact (device, vendor) first, then the device's generic entry (vendor unset), else
errors with the registered keys. The device and vendor default to the current platform's;
``VERL_ENGINE_DEVICE`` / ``VERL_ENGINE_VENDOR`` override them.
"""

from __future__ import annotations

import os
from typing import Any

from verl.core.registry import Registry


def engine_device_key(device: str | None = None, vendor: str | None = None) -> tuple[str, str | None]:
    """(device, vendor) for an engine lookup: explicit arguments, else the environment overrides,
    else the current platform's."""
    env_device = os.environ.get("VERL_ENGINE_DEVICE", "").strip() or None
    env_vendor = os.environ.get("VERL_ENGINE_VENDOR", "").strip() or None
    if device is None:
        device = env_device
    if vendor is None:
        vendor = env_vendor
    if device is None or vendor is None:
        from verl.core.platform import get_platform

        platform = get_platform()
        device = device or platform.device_name
        vendor = vendor or platform.vendor_name
    return device, vendor


class DeviceRegistry(Registry):
    """A registry whose keys end in (device, vendor), with vendor generic."""

    def __init__(self, kind: str, keys: tuple[str, ...]):
        super().__init__(kind, keys=(*keys, "device", "vendor"), generic=("vendor",))

    def get(self, *args: Any, device: str | None = None, vendor: str | None = None, **fields: Any):
        names = self.keys[:-2]
        if args:
            if len(args) > len(names):
                raise TypeError(f"{self.kind} lookup takes {list(names)} positionally")
            fields.update(zip(names, args))
        device, vendor = engine_device_key(device, vendor)
        from verl.core.plugins import load_plugins

        load_plugins()  # engines register from verl.plugins modules (a platform lookup loads only platforms)
        return super().get(**fields, device=device, vendor=vendor)


#: ``@EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device=["cpu", "cuda"])``
EngineRegistry = DeviceRegistry("training engine", keys=("model_type", "backend"))

#: ``@RolloutRegistry.register(backend="hf", device=["cpu", "cuda", "npu"])``
RolloutRegistry = DeviceRegistry("rollout engine", keys=("backend",))
