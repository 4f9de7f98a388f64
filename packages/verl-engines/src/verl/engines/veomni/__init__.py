"""The VeOmni training engine (``backend="veomni"``; verl's ``actor_rollout_ref.actor.strategy=veomni``).

VeOmni is optional (``pip install --no-deps veomni==0.1.12 && pip install transformers==5.9.0 einops``: its
declared dependencies are not used and clash with verl-algos'; see the ``tests-veomni`` nox session). The modules import it inside functions, so importing this package (which
``import verl.engines`` does, to register the engine) never needs it:

- ``config``: ``VeOmniEngineConfig``, the FSDP engine's keys plus ``expert_parallel_size``.
- ``build``: VeOmni's parallel state, patched model, op kernels (the platform's choice) and FSDP2 wrapping.
- ``engine``: ``VeOmniEngine`` / ``VeOmniValueEngine`` (critic, reward model), the ``TrainingEngine`` over them.
"""

from verl.engines.veomni.config import VeOmniEngineConfig
from verl.engines.veomni.engine import VeOmniEngine, VeOmniValueEngine

__all__ = ["VeOmniEngine", "VeOmniEngineConfig", "VeOmniValueEngine"]
