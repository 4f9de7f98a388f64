"""``RolloutHost``: what a worker that serves the rollout engine needs, whether the engine shares the
actor's process (``ActorRolloutRefWorker``, the hybrid engine) or runs on a pool of its own
(``RolloutWorker``, ``actor_rollout_ref.hybrid_engine=false``): building the engine from the rollout
section, sizing its generation batches, and the agent loops of multi-turn rollouts."""

from __future__ import annotations

from typing import Any

from verl.algos.config.schema import PPOConfig
from verl.algos.workers.engine_config import rollout_engine_values
from verl.core.engine import RolloutRegistry, SamplingParams
from verl.core.protocol import DataProto


class RolloutHost:
    config: PPOConfig
    rollout: Any
    agent_context: Any

    def build_rollout(self, model_path: str, dp_size: int) -> None:
        """``self.rollout`` (and ``self.agent_context`` with ``multi_turn.enable``) for ``dp_size``
        data-parallel rollout replicas."""
        cfg = self.config.actor_rollout_ref
        rollout_cls = RolloutRegistry.get(cfg.rollout.name)
        self.rollout = rollout_cls(
            rollout_engine_values(
                rollout_cls.config_class, self._rollout_values(model_path, dp_size), cfg.rollout, cfg.rollout.name
            )
        )
        self.agent_context = self._agent_context(model_path) if cfg.rollout.multi_turn.enable else None

    def _rollout_values(self, model_path: str, dp_size: int) -> dict[str, Any]:
        cfg = self.config.actor_rollout_ref
        rollout = cfg.rollout
        return {
            "model_path": model_path,
            "tokenizer_path": cfg.model.tokenizer_path or model_path,
            "trust_remote_code": cfg.model.trust_remote_code,
            "override_config": dict(cfg.model.override_config),
            # Every engine's serving settings (the schema node extends each engine's class); an engine
            # takes those it declares (rollout_engine_values).
            **rollout.serving_values(),
            # The actor's weights arrive before every generation: no need to read them from disk twice.
            "load_format": "dummy",
            "prompt_length": self.config.data.max_prompt_length,
            "response_length": self.config.data.max_response_length,
            "generation_batches": self._generation_batches(dp_size),
            "seed": self.config.trainer.seed,
            "lora_rank": cfg.model.lora_rank,  # an engine that serves adapters sizes its slots from it
            "engine_kwargs": dict(rollout.engine_kwargs),
            **rollout.engine_kwargs,
        }

    def _generation_batches(self, dp: int) -> list[dict[str, Any]]:
        """The generation calls of this run on one rank (the vllm rollout sizes its CPU KV cache for the
        largest); prompts None: known only at run time (validation over the whole held-out set)."""
        data, trainer = self.config.data, self.config.trainer
        rollout = self.config.actor_rollout_ref.rollout
        batches = [{"name": "training", "prompts": -(-data.train_batch_size // dp), "n": rollout.n}]
        if trainer.val_before_train or trainer.val_only or trainer.test_freq > 0:
            bounds = [v for v in (data.val_batch_size, data.val_max_samples) if v is not None and v > 0]
            val = -(-min(bounds) // dp) if bounds else None
            batches.append({"name": "validation", "prompts": val, "n": rollout.val_kwargs.n})
        return batches

    def _agent_context(self, model_path: str):
        from transformers import AutoTokenizer

        from verl.algos.agent.rollout import agent_context
        from verl.algos.data.chat_template import set_chat_template

        cfg = self.config.actor_rollout_ref
        tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer_path or model_path)
        if cfg.model.custom_chat_template:
            set_chat_template(tokenizer, cfg.model.custom_chat_template)
        eos = list(self.rollout.eos_token_ids)
        data = self.config.data
        return agent_context(
            tokenizer,
            eos,
            data.max_response_length,
            cfg.rollout.multi_turn,
            data.max_prompt_length,
            cfg.rollout.agent.agent_loop_config_path,
        )

    def agent_generate(self, engine, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        """Generation through the agent loops (``multi_turn.enable``)."""
        from verl.algos.agent.rollout import generate_with_agent_loops

        default = self.config.actor_rollout_ref.rollout.agent.default_agent_loop
        return generate_with_agent_loops(engine, prompts, sampling, self.agent_context, engine.pad_token_id, default)
