"""The ``hf`` rollout engine (transformers on any torch device); see :mod:`.engine`.

Importing this package registers it with ``RolloutRegistry`` as backend "hf"."""

from verl.engines.rollout.hf.config import HFRolloutConfig
from verl.engines.rollout.hf.engine import HFRolloutEngine

__all__ = ["HFRolloutConfig", "HFRolloutEngine"]
