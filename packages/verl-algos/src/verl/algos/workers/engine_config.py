"""Building a training engine's config from the run config.

Engines name their config fields after verl's keys (``optim``, ``fsdp_config``,
``ppo_micro_batch_size_per_gpu``, ...), and the run config's ``optim`` and ``fsdp_config`` nodes *are* the
engine's classes (:class:`~verl.engines.optim_config.OptimConfig`,
:class:`~verl.engines.fsdp.config.FSDPConfig`): a worker hands the role's objects over as they are. A
value the engine's ``config_class`` does not declare is an error that names it, never dropped.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from verl.algos.config.schema import ModelConfig
from verl.engines.fsdp.config import FSDPConfig
from verl.engines.optim_config import OptimConfig

logger = logging.getLogger(__name__)


def engine_config(config_class: type, values: dict[str, Any]) -> Any:
    """``config_class(**values)``; a key it does not declare is an error naming the key and the class."""
    if not dataclasses.is_dataclass(config_class):
        raise TypeError(f"an engine's config_class must be a dataclass, got {config_class!r}")
    declared = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(set(values) - declared)
    if unknown:
        raise ValueError(
            f"{config_class.__module__}.{config_class.__name__} takes no {', '.join(unknown)}: this engine "
            "cannot honour these settings; choose an engine that has them or leave them at their defaults"
        )
    return config_class(**values)


def training_engine_values(
    *,
    model_path: str,
    model: ModelConfig,
    optim: OptimConfig,
    fsdp_config: FSDPConfig,
    micro_batch_size: int,
    use_dynamic_bsz: bool,
    max_token_len: int,
    seed: int,
    forward_micro_batch_size: int | None = None,
    forward_use_dynamic_bsz: bool | None = None,
    forward_max_token_len: int | None = None,
) -> dict[str, Any]:
    """The verl-named values of one role that a training engine takes (the typed nodes as they are)."""
    return {
        "model_path": model_path,
        "tokenizer_path": model.tokenizer_path or model_path,
        "trust_remote_code": model.trust_remote_code,
        "enable_gradient_checkpointing": model.enable_gradient_checkpointing,
        "use_remove_padding": model.use_remove_padding,
        "share_prompts": model.share_prompts,
        "override_config": dict(model.override_config),
        "ppo_micro_batch_size_per_gpu": micro_batch_size,
        "use_dynamic_bsz": use_dynamic_bsz,
        "ppo_max_token_len_per_gpu": max_token_len,
        "log_prob_micro_batch_size_per_gpu": forward_micro_batch_size,
        "log_prob_use_dynamic_bsz": forward_use_dynamic_bsz,
        "log_prob_max_token_len_per_gpu": forward_max_token_len,
        "seed": seed,
        "optim": optim,
        "fsdp_config": fsdp_config,
    }


def rollout_engine_values(config_class: type, values: dict[str, Any], section: Any, engine: str) -> Any:
    """A rollout engine's config from the rollout section. verl keeps every serving engine's knobs in that
    one section (vLLM's scheduler, memory and graph settings sit beside the sampling settings), so an
    engine takes the keys its ``config_class`` declares. A key it does not declare that the user changed
    from its default (``section``: the run's rollout node) is named in a warning, never dropped silently:
    it is another engine's knob, and a verl script moved to this engine may still carry it."""
    declared = {f.name for f in dataclasses.fields(config_class)}
    defaults = type(section)()
    unread = sorted(
        key
        for key in set(values) - declared
        if hasattr(section, key) and getattr(section, key) != getattr(defaults, key)
    )
    if unread:
        settings = ", ".join(f"actor_rollout_ref.rollout.{key}={getattr(section, key)!r}" for key in unread)
        logger.warning(
            "%s: the %s rollout engine does not read these (another engine's settings); they have no effect",
            settings,
            engine,
        )
    return config_class(**{k: v for k, v in values.items() if k in declared})
