"""The Acme XPU platform: what verl needs to know about the chip.

The (fictitious) Acme XPU is driven through torch's existing ``cpu`` device type, so the platform
subclasses verl's public :class:`~verl.core.platform.CPUPlatform` and changes only what differs: its
name, its vendor, its priority and how to tell whether the chip is there. A chip with its own torch
device type would subclass :class:`~verl.core.platform.PlatformBase` instead and implement every
device method (see verl-platform-npu for one whose torch extension is imported lazily).
"""

from __future__ import annotations

import os

from verl.core.platform import CPUPlatform, PlatformRegistry

#: The example has no real chip: setting this variable to 1 stands in for "the driver sees a device".
VISIBLE_ENV = "ACME_XPU_VISIBLE"


@PlatformRegistry.register(platform="acme")  # VERL_PLATFORM=acme selects it
class AcmeXPUPlatform(CPUPlatform):
    vendor_name = "acme"  # the key engines are registered under (vendor="acme")
    # Above the CPU platform (-100), so that auto-detection picks the chip wherever it is present,
    # and below the GPU/NPU platforms (100+), which a host with such a device wants instead.
    priority = 50

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        """Never raises, never imports the vendor's runtime at module import time: a real plugin would
        import its torch extension here (lazily) and ask its driver for a device count."""
        value = os.environ.get(VISIBLE_ENV, "").strip().lower()
        if value in ("1", "true", "yes"):
            return True, f"Acme XPU visible ({VISIBLE_ENV}={value}), driven through torch's cpu device"
        return False, f"no Acme XPU visible: set {VISIBLE_ENV}=1 to use the example chip"
