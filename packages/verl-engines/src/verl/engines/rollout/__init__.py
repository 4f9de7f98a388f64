"""Rollout engines. ``hf`` (transformers) is built in; vllm and sglang adapters implement the same
``verl.core.engine.RolloutEngine`` interface in their own modules."""
