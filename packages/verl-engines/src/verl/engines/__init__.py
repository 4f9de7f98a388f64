"""verl engines: training engines (FSDP2, megatron, VeOmni) and rollout engines (hf), plus the hybrid engine.

Importing this package (the ``engines`` entry point of the ``verl.plugins`` group) registers the FSDP2,
megatron and VeOmni training engines with ``EngineRegistry`` and the hf rollout engine with ``RolloutRegistry``.
Optional backends (vllm, sglang, megatron-core) are imported only when an engine is built.
"""

import verl.engines.rollout.vllm  # noqa: F401  (registers "vllm"; vLLM itself is imported only when used)
from verl.engines import (
    fsdp,  # noqa: F401  (registers "fsdp"/"fsdp2" training engines)
    megatron,  # noqa: F401  (registers "megatron"; megatron-core is imported when built)
    veomni,  # noqa: F401  (registers "veomni"; VeOmni is imported when built)
)
from verl.engines.rollout import hf  # noqa: F401  (registers the "hf" rollout engine)
