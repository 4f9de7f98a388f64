"""The Acme training engine: verl's FSDP2 engine with what the Acme XPU needs changed.

Registered for ``(language_model, fsdp)`` on the ``cpu`` device type with ``vendor="acme"``: on the Acme
platform, ``EngineRegistry.get(model_type="language_model", backend="fsdp")`` finds this exact entry
before the generic cpu one (``verl.engines.fsdp.FSDPEngine``); on any other platform nothing changes.
"""

from __future__ import annotations

from verl.core.engine import EngineRegistry
from verl.engines.fsdp import FSDPEngine, FSDPEngineConfig

#: Attention implementations the (fictitious) Acme compiler has kernels for.
SUPPORTED_ATTENTION = ("sdpa", "eager")


@EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device="cpu", vendor="acme")
class AcmeFSDPEngine(FSDPEngine):
    """Everything is inherited from :class:`~verl.engines.fsdp.FSDPEngine`; a vendor overrides only
    what its chip does differently. Here: refuse, before any work, attention kernels the chip lacks."""

    def __init__(self, config: FSDPEngineConfig | dict):
        super().__init__(config)
        attention = self.config.attn_implementation
        if attention not in SUPPORTED_ATTENTION:
            raise ValueError(
                f"attn_implementation={attention!r} is not available on the Acme XPU; "
                f"use one of {list(SUPPORTED_ATTENTION)}"
            )
