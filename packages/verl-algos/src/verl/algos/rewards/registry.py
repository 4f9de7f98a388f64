"""Registries of the reward package.

- ``REWARD_MANAGERS`` (``reward_model.reward_manager``): naive, batch, dapo. A manager turns a batch of
  decoded responses into ``token_level_scores``.
- ``REWARD_SCORERS``: the built-in scorer of each ``data_source``, used by
  :func:`verl.algos.rewards.default.default_compute_score`. A plugin may register more with
  ``@REWARD_SCORERS.register(data_source=["my/source"])``; the function takes
  ``(solution_str, ground_truth, extra_info=None)``.
"""

from __future__ import annotations

from verl.core.registry import Registry

REWARD_MANAGERS: Registry[type] = Registry("reward manager")
REWARD_SCORERS: Registry = Registry("reward function", keys=("data_source",))
