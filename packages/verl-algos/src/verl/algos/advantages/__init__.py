"""Advantage estimators, selected by ``algorithm.adv_estimator``.

Importing this package registers the built-ins: gae, grpo (alias grpo_vectorized), grpo_passk, rloo
(alias rloo_vectorized), opo, gpg, reinforce_plus_plus, reinforce_plus_plus_baseline, remax,
optimal_token_baseline. See :mod:`.registry` for the signature.
"""

from verl.algos.advantages import (  # noqa: F401  (register the estimators)
    baselines,
    gae,
    grpo,
    optimal_baseline,
    reinforce,
)
from verl.algos.advantages.apply import compute_advantage, greedy_reward_baselines
from verl.algos.advantages.registry import ADV_ESTIMATORS, get_adv_estimator, register_adv_estimator

__all__ = [
    "ADV_ESTIMATORS",
    "compute_advantage",
    "get_adv_estimator",
    "greedy_reward_baselines",
    "register_adv_estimator",
]
