"""Checks of every config value that names a registered thing (estimator, loss, KL type, reward
manager, engine backend, tracker), run before Ray starts so a typo never launches workers."""

from __future__ import annotations

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
    (:func:`~verl.algos.workers.engine_config.training_engine_values`); an engine takes the ones its
    ``config_class`` declares and names the others a user changed in a warning. An engine (one registered
    by a plugin) that lacks what every role needs (the model, the optimizer, the micro-batch size) is
    refused here, before Ray starts, instead of in every worker; so is a megatron layout the processes
    cannot hold (the roles share processes, so the reference and the critic take the actor's layout)."""
    from verl.algos.workers.engine_config import engine_takes, megatron_setting, missing_required

    actor = cfg.actor_rollout_ref.actor
    missing = missing_required(engine_cls.config_class)
    if missing:
        raise ConfigError(
            f"actor_rollout_ref.actor.strategy={actor.strategy}: the PPO workers cannot drive "
            f"{engine_cls.__module__}.{engine_cls.__qualname__} (it takes none of {', '.join(missing)}, "
            "which every role needs); use strategy=fsdp2 or strategy=megatron"
        )
    if not engine_takes(engine_cls.config_class, "megatron"):
        return
    for role in ("actor_rollout_ref.ref.megatron", "critic.megatron"):
        try:
            megatron_setting(cfg, role)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    from verl.algos.config.placement import plan_placement, world_key

    placement = plan_placement(cfg)
    layout = actor.megatron
    model_parallel = layout.tensor_model_parallel_size * layout.pipeline_model_parallel_size
    for role in placement.roles:  # the critic and the reward model take the actor's layout
        if role == "rollout":  # a rollout pool of its own serves the rollout engine's layout, not megatron's
            continue
        world = placement.world(role)
        if world % model_parallel:
            raise ConfigError(
                f"actor_rollout_ref.actor.megatron: tensor_model_parallel_size x pipeline_model_parallel_size = "
                f"{model_parallel} ranks per model copy does not divide {world_key(placement, role)} = "
                f"{world} ranks"
            )
