"""Advantage estimators, selected by ``algorithm.adv_estimator``.

Importing this package registers the built-ins: gae, grpo, grpo_passk, rloo, opo, gpg,
reinforce_plus_plus, reinforce_plus_plus_baseline, remax. See :mod:`.registry` for the signature.
"""

from verl.algos.advantages import baselines, gae, grpo, reinforce  # noqa: F401  (register the estimators)
from verl.algos.advantages.apply import compute_advantage, greedy_reward_baselines
from verl.algos.advantages.registry import ADV_ESTIMATORS, get_adv_estimator, register_adv_estimator

__all__ = [
    "ADV_ESTIMATORS",
    "compute_advantage",
    "get_adv_estimator",
    "greedy_reward_baselines",
    "register_adv_estimator",
]
