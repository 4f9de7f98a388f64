"""The Megatron training backend (``backend="megatron"``): megatron-core's GPTModel with tensor, pipeline
and (MoE models) expert parallelism, loaded from and exported to Hugging Face folders by our own converter.

megatron-core is optional (``pip install 'verl-engines[megatron]'``). The modules here import it
lazily, inside functions, so importing this package (which ``import verl.engines`` does, to register
``MegatronEngine`` / ``MegatronValueEngine`` as backend "megatron" for cpu, cuda and npu) never needs it:

- ``model_config``: HF config -> ``TransformerConfig`` / ``GPTModel`` (Llama, Qwen2, Qwen3; Qwen2-MoE and
  Qwen3-MoE with expert parallelism).
- ``layer_spec``: Transformer Engine spec on CUDA with TE, megatron's local spec elsewhere.
- ``convert`` / ``sharding``: HF <-> megatron weights, TP shards and pipeline stages (pure tensor code).
- ``parallel``: megatron's process groups, laid out as ``verl.core.parallel_dims.ParallelDims``.
- ``rng``: megatron's RNG tracker (a CPU-generator one on the CPU platform).
- ``inputs`` / ``logprob`` / ``schedule``: rollout batches through the pipeline schedule, log-probs and
  entropy computed vocab-parallel.
- ``build``: this rank's model chunks, loading HF weights into them and gathering them back.
- ``ddp`` / ``optimizer``: megatron's DDP (gradients summed over data parallelism, as verl's losses
  expect), megatron's optimizer under verl's ``OptimConfig`` and the FSDP engine's lr schedule.
- ``adam_state`` / ``checkpoint``: layout-independent checkpoints (full HF-named fp32 masters and Adam
  moments, safetensors) for the plain, mixed-precision and distributed optimizers.
- ``offload``: parameters, gradient buffers and optimizer state to host memory and back.
- ``value_head``: the ``score`` head of value models, replicated over TP.
- ``engine``: ``MegatronEngine``, the ``TrainingEngine`` over all of the above.

Platform specifics go through ``PlatformBase.backend_environment("megatron")`` (the CPU platform's
cuda -> cpu redirect, the NPU platform's MindSpeed adaptor).
"""

# Registers "megatron" with EngineRegistry; engine.py imports megatron-core only inside its methods.
from verl.engines.megatron.config import MegatronConfig, MegatronEngineConfig
from verl.engines.megatron.engine import MegatronEngine, MegatronValueEngine

__all__ = ["MegatronConfig", "MegatronEngine", "MegatronEngineConfig", "MegatronValueEngine"]
