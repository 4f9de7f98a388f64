"""verl plugin for the (fictitious) Acme XPU: an example of a vendor package.

verl imports ``verl_acme_xpu.platform`` through the ``verl.platforms`` entry point (a platform lookup
needs only that) and ``verl_acme_xpu.plugin`` through the ``verl.plugins`` entry point, both declared in
pyproject.toml. Importing ``plugin`` registers the Acme platform and the Acme training engine; nothing else
is needed. This package's own import stays light (names load on first use), because importing
``verl_acme_xpu.platform`` imports it first.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"AcmeFSDPEngine": "verl_acme_xpu.engine", "AcmeXPUPlatform": "verl_acme_xpu.platform"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'verl_acme_xpu' has no attribute {name!r}")
