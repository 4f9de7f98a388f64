"""verl engines: training engines (FSDP2) and rollout engines (hf), plus the hybrid engine.

Importing this package (the ``engines`` entry point of the ``verl.plugins`` group) registers the FSDP2
training engines with ``EngineRegistry`` and the hf rollout engine with ``RolloutRegistry``. Optional
backends (vllm, sglang, megatron) live in their own modules and are imported only when asked for.
"""

import verl.engines.rollout.vllm  # noqa: F401  (registers "vllm"; vLLM itself is imported only when used)
from verl.engines import fsdp  # noqa: F401  (registers "fsdp"/"fsdp2" training engines)
from verl.engines.rollout import hf  # noqa: F401  (registers the "hf" rollout engine)
