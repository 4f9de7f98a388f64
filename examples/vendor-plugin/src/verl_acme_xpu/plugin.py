"""The ``verl.plugins`` entry point of the Acme plugin: importing it registers the Acme platform and the
Acme training engine."""

from verl_acme_xpu.engine import AcmeFSDPEngine
from verl_acme_xpu.platform import AcmeXPUPlatform

__all__ = ["AcmeFSDPEngine", "AcmeXPUPlatform"]
