"""``CriticWorker``: a value model trained with the clipped value loss (PPO with GAE)."""

from __future__ import annotations

import functools
import time
from typing import Any

from verl.algos.config.schema import PPOConfig
from verl.algos.losses.value import make_critic_loss_fn
from verl.algos.workers.engine_config import (
    engine_takes,
    megatron_setting,
    role_setting,
    training_engine_config,
    training_engine_values,
)
from verl.algos.workers.update_loop import mean_metrics, ppo_update
from verl.core.controller import Dispatch, Worker, register
from verl.core.engine import VALUE_MODEL, EngineRegistry
from verl.core.protocol import DataProto
from verl.core.seeding import seed_host_rngs


class CriticWorker(Worker):
    def __init__(self, config: PPOConfig):
        self.config = config
        self.critic = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict[str, Any]:
        seed_host_rngs(self.config.trainer.seed)  # Python's and numpy's RNGs, as torch's: from trainer.seed
        from verl.engines.model_zoo import resolve_model_path

        cfg = self.config.critic
        model_cfg = cfg.model if cfg.model.path else self.config.actor_rollout_ref.model
        model_path = resolve_model_path(model_cfg.path)
        strategy = self.config.actor_rollout_ref.actor.strategy
        engine_cls = EngineRegistry.get(VALUE_MODEL, strategy)
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
        self.critic = engine_cls(training_engine_config(engine_cls.config_class, values, strategy))
        self.critic.initialize()
        self.set_dp_info(self.critic.dp_rank, self.critic.dp_size, self.critic.is_collect_rank)
        return {"model_path": model_path}

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, data: DataProto) -> DataProto:
        with self.critic.eval_mode():
            out = self.critic.forward_only(data)
        return DataProto.from_dict({"values": out["values"]})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def update_critic(self, data: DataProto) -> dict[str, float]:
        cfg = self.config.critic
        actor_cfg = self.config.actor_rollout_ref.actor
        prompts = cfg.ppo_mini_batch_size or actor_cfg.ppo_mini_batch_size
        rows = prompts * self.config.actor_rollout_ref.rollout.n // self.critic.dp_size
        start = time.perf_counter()
        with self.critic.train_mode():
            metrics = ppo_update(
                self.critic,
                data,
                mini_batch_rows=rows,
                epochs=cfg.ppo_epochs or actor_cfg.ppo_epochs,
                shuffle=actor_cfg.shuffle,
                seed=int(data.meta_info.get("global_step", 0)),
                make_loss_fn=lambda normalizer: make_critic_loss_fn(cfg.cliprange_value, cfg.loss_agg_mode, normalizer),
                metric_prefix="critic",
            )
            lr = self.critic.lr_scheduler_step()
        result = mean_metrics(metrics)
        result["critic/lr"] = lr
        result["timing_s/update_critic_in_worker"] = time.perf_counter() - start
        return result

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        self.critic.save_checkpoint(path)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        self.critic.load_checkpoint(path)
