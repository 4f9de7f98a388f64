"""Checks of every config value that names a registered thing (estimator, loss, KL type, reward
manager, engine backend, tracker), run before Ray starts so a typo never launches workers."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from verl.algos.config.schema import PPOConfig
from verl.core.config import ConfigError
from verl.core.registry import RegistryError


def _check(key: str, lookup: Callable[[], Any]) -> None:
    try:
        lookup()
    except RegistryError as exc:
        raise ConfigError(f"{key}: {exc}") from None


def check_registered_names(cfg: PPOConfig) -> None:
    from verl.algos.advantages.registry import ADV_ESTIMATORS, NOT_YET
    from verl.algos.losses.kl import KL_ESTIMATORS
    from verl.algos.policy_losses.registry import POLICY_LOSSES
    from verl.algos.rewards.registry import REWARD_MANAGERS
    from verl.algos.tracking import TRACKERS
    from verl.core.engine import LANGUAGE_MODEL, EngineRegistry, RolloutRegistry
    from verl.core.plugins import load_plugins

    load_plugins()
    actor = cfg.actor_rollout_ref.actor
    if cfg.algorithm.adv_estimator in NOT_YET:
        raise ConfigError(
            f"algorithm.adv_estimator={cfg.algorithm.adv_estimator}: {NOT_YET[cfg.algorithm.adv_estimator]}"
        )
    _check("algorithm.adv_estimator", lambda: ADV_ESTIMATORS.get(cfg.algorithm.adv_estimator))
    _check("actor_rollout_ref.actor.policy_loss.loss_mode", lambda: POLICY_LOSSES.get(actor.policy_loss.loss_mode))
    if actor.use_kl_loss:  # a "+" suffix selects the straight-through variant of the same estimator
        _check("actor_rollout_ref.actor.kl_loss_type", lambda: KL_ESTIMATORS.get(actor.kl_loss_type.rstrip("+")))
    if cfg.algorithm.use_kl_in_reward:
        _check("algorithm.kl_penalty", lambda: KL_ESTIMATORS.get(cfg.algorithm.kl_penalty.rstrip("+")))
    _check("reward_model.reward_manager", lambda: REWARD_MANAGERS.get(cfg.reward_model.reward_manager))
    _check("actor_rollout_ref.actor.strategy", lambda: EngineRegistry.get(LANGUAGE_MODEL, actor.strategy))
    _check_workers_drive(cfg, EngineRegistry.get(LANGUAGE_MODEL, actor.strategy))
    _check("actor_rollout_ref.rollout.name", lambda: RolloutRegistry.get(cfg.actor_rollout_ref.rollout.name))
    for name in cfg.trainer.logger:
        _check("trainer.logger", lambda name=name: TRACKERS.get(name))


def _check_workers_drive(cfg: PPOConfig, engine_cls: type) -> None:
    """The role workers hand a training engine the role's settings by verl's names
    (:func:`~verl.algos.workers.engine_config.training_engine_values`), and an engine refuses a setting it
    does not declare. An engine registered by a plugin (or one whose worker integration is not built) that
    lacks some of them is refused here, before Ray starts, instead of in every worker."""
    from verl.algos.workers.engine_config import training_engine_values

    actor = cfg.actor_rollout_ref.actor
    passed = training_engine_values(
        model_path="",
        model=cfg.actor_rollout_ref.model,
        optim=actor.optim,
        fsdp_config=actor.fsdp_config,
        micro_batch_size=actor.ppo_micro_batch_size_per_gpu,
        use_dynamic_bsz=actor.use_dynamic_bsz,
        max_token_len=actor.ppo_max_token_len_per_gpu,
        seed=cfg.trainer.seed,
    )
    declared = {f.name for f in dataclasses.fields(engine_cls.config_class)}
    missing = sorted(set(passed) - declared)
    if missing:
        raise ConfigError(
            f"actor_rollout_ref.actor.strategy={actor.strategy}: the PPO workers cannot drive "
            f"{engine_cls.__module__}.{engine_cls.__qualname__} yet (it takes none of {', '.join(missing)}, "
            "which the workers pass); use strategy=fsdp2"
            + (
                ". The Megatron engine trains and is tested on its own (nox -s tests-megatron); its worker "
                "integration (dispatch over data-parallel ranks, the actor.megatron section) is not built yet"
                if actor.strategy == "megatron"
                else ""
            )
        )
