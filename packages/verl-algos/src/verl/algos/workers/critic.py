"""``CriticWorker``: a value model trained with the clipped value loss (PPO with GAE)."""

from __future__ import annotations

import functools
from typing import Any

from verl.algos.config.schema import PPOConfig
from verl.algos.losses.value import make_critic_loss_fn
from verl.algos.workers.engine_config import (
    engine_takes,
    lora_setting,
    megatron_setting,
    role_setting,
    training_engine_values,
)
from verl.algos.workers.engine_worker import EngineWorker
from verl.algos.workers.update_loop import update_role
from verl.core.controller import Dispatch, register
from verl.core.engine import VALUE_MODEL, EngineRegistry
from verl.core.protocol import DataProto


class CriticWorker(EngineWorker):
    def __init__(self, config: PPOConfig):
        super().__init__(config)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict[str, Any]:
        cfg = self.config.critic
        model_cfg = cfg.model if cfg.model.path else self.config.actor_rollout_ref.model
        model_path = self.begin_init(model_cfg.path)
        strategy = self.config.actor_rollout_ref.actor.strategy
        engine_cls = EngineRegistry.get(VALUE_MODEL, strategy)
        values = self.engine_values(model_path, engine_cls)
        self.engine = self.build_engine(engine_cls, values, strategy)
        return {"model_path": model_path}

    def engine_values(self, model_path: str, engine_cls: type) -> dict[str, Any]:
        """The critic's settings for its engine. Without ``critic.model.path`` the critic starts from the
        actor's model folder and model settings, but its LoRA keys are ``critic.model``'s, as in verl."""
        cfg = self.config.critic
        model_cfg = cfg.model if cfg.model.path else self.config.actor_rollout_ref.model
        setting = functools.partial(role_setting, self.config)
        values = training_engine_values(
            model_path=model_path,
            model=model_cfg,
            model_key="critic.model" if cfg.model.path else "actor_rollout_ref.model",
            optim=cfg.optim,
            fsdp_config=setting("critic.fsdp_config"),
            megatron=(
                megatron_setting(self.config, "critic.megatron")
                if engine_takes(engine_cls.config_class, "megatron")
                else setting("critic.megatron")
            ),
            micro_batch_size=cfg.ppo_micro_batch_size_per_gpu,
            use_dynamic_bsz=setting("critic.use_dynamic_bsz"),
            max_token_len=setting("critic.ppo_max_token_len_per_gpu"),
            sequence_parallel=setting("critic.ulysses_sequence_parallel_size"),
            seed=self.config.trainer.seed,
        )
        values["lora"] = lora_setting(cfg.model, "critic.model")
        return values

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, data: DataProto) -> DataProto:
        with self.engine.eval_mode():
            out = self.engine.forward_only(data)
        return DataProto.from_dict({"values": out["values"]})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def update_critic(self, data: DataProto) -> dict[str, float]:
        cfg = self.config.critic
        actor_cfg = self.config.actor_rollout_ref.actor
        prompts = cfg.ppo_mini_batch_size or actor_cfg.ppo_mini_batch_size
        rows = prompts * self.config.actor_rollout_ref.rollout.n // self.engine.dp_size
        return update_role(
            self.engine,
            data,
            mini_batch_rows=rows,
            epochs=cfg.ppo_epochs or actor_cfg.ppo_epochs,
            shuffle=actor_cfg.shuffle,
            make_loss_fn=lambda normalizer: make_critic_loss_fn(cfg.cliprange_value, cfg.loss_agg_mode, normalizer),
            metric_prefix="critic",
        )
