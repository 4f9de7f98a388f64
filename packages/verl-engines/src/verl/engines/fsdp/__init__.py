"""The FSDP2 training engine (``backend="fsdp"`` / ``"fsdp2"``), registered for cpu, cuda and npu.

``FSDPEngine`` is the public class vendors subclass (register the subclass with a ``vendor=`` key to
win over the generic entry on that vendor's devices).
"""

from verl.engines.fsdp.config import FSDPConfig, FSDPEngineConfig, OptimConfig
from verl.engines.fsdp.engine import FSDPEngine, FSDPValueEngine

__all__ = ["FSDPConfig", "FSDPEngine", "FSDPEngineConfig", "FSDPValueEngine", "OptimConfig"]
