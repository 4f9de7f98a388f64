"""Rewards: managers (``reward_model.reward_manager``: naive, batch, dapo), built-in scorers by
data_source (gsm8k, math, numeric, code), and loading of a user's ``custom_reward_function``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verl.algos.rewards import batch, code, dapo  # noqa: F401  (register the managers and code's data sources)
from verl.algos.rewards.config import CustomRewardFunctionConfig
from verl.algos.rewards.custom import load_custom_reward_function
from verl.algos.rewards.default import default_compute_score
from verl.algos.rewards.failures import RewardFunctionError
from verl.algos.rewards.manager import NaiveRewardManager, RewardManager, RewardResult
from verl.algos.rewards.registry import REWARD_MANAGERS, REWARD_SCORERS
from verl.algos.rewards.scoring import RewardSetupError
from verl.core.config import as_node


def load_reward_fn(custom_reward_function: CustomRewardFunctionConfig | Mapping[str, Any] | None = None):
    """The user's reward function from the ``custom_reward_function`` config (``path``, ``name``,
    ``reward_kwargs``), or None when no path is set (the managers then use the built-in scorers)."""
    config = as_node(CustomRewardFunctionConfig, custom_reward_function, "custom_reward_function")
    if not config.path:
        return None
    kwargs = dict(config.reward_kwargs) if config.reward_kwargs else None
    return load_custom_reward_function(config.path, config.name, kwargs)


def build_reward_manager(name: str, tokenizer: Any, compute_score=None, **kwargs: Any) -> RewardManager:
    """The reward manager registered as ``name`` (naive, batch, dapo), e.g.
    ``build_reward_manager("dapo", tok, compute_score=load_reward_fn(cfg.custom_reward_function),
    num_examine=1, max_resp_len=512, overlong_buffer=cfg.reward_model.overlong_buffer)``."""
    cls = REWARD_MANAGERS.get(name)
    return cls(tokenizer, compute_score=compute_score, **kwargs)


__all__ = [
    "REWARD_MANAGERS",
    "REWARD_SCORERS",
    "NaiveRewardManager",
    "RewardManager",
    "RewardFunctionError",
    "RewardResult",
    "RewardSetupError",
    "build_reward_manager",
    "default_compute_score",
    "load_custom_reward_function",
    "load_reward_fn",
]
