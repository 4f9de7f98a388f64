"""verl plugin for the (fictitious) Acme XPU: an example of a vendor package.

verl imports this module through the ``verl.plugins`` entry point declared in pyproject.toml. Importing
it registers the Acme platform and the Acme training engine; nothing else is needed.
"""

from verl_acme_xpu.engine import AcmeFSDPEngine
from verl_acme_xpu.platform import AcmeXPUPlatform

__all__ = ["AcmeFSDPEngine", "AcmeXPUPlatform"]
