"""Generalized Advantage Estimation for critic-based PPO (``adv_estimator=gae``)."""

from __future__ import annotations

import torch

from verl.algos.advantages.config import AdvantageConfig
from verl.algos.advantages.registry import EstimatorInputs, register_token_estimator
from verl.algos.data.masked import masked_whiten


@register_token_estimator("gae", needs=("values",))
def compute_gae_advantage_return(
    x: EstimatorInputs, config: AdvantageConfig, **kw
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE (Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
    Estimation", arXiv:1506.02438).

    Over the valid tokens t of a response, walking backwards (V after the last valid token is 0)::

        delta_t = r_t + gamma * V_{t+1} - V_t
        A_t     = delta_t + gamma * lam * A_{t+1}
        R_t     = A_t + V_t                      (the critic's regression target)

    Masked positions inside a response (e.g. tool output in multi-turn rollouts) are skipped: the
    next valid token's value and advantage carry across them. Advantages are then whitened over all
    valid tokens of the batch. Config: ``gamma`` (default 1.0), ``lam`` (default 1.0).
    """
    values = x.values
    if values is None:
        raise ValueError("adv_estimator='gae' needs the critic's values: run the critic (compute_values) first")
    gamma, lam = config.gamma, config.lam
    rewards, mask = x.token_level_rewards, x.mask
    batch, length = rewards.shape
    next_value = torch.zeros(batch, dtype=rewards.dtype, device=rewards.device)
    last_gae = torch.zeros_like(next_value)
    advantages = torch.zeros_like(rewards)
    for t in reversed(range(length)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        gae_t = delta + gamma * lam * last_gae
        m = mask[:, t]
        # Only valid tokens advance the recursion; masked ones carry the state through.
        next_value = values[:, t] * m + (1 - m) * next_value
        last_gae = gae_t * m + (1 - m) * last_gae
        advantages[:, t] = gae_t * m
    returns = (advantages + values) * mask
    return masked_whiten(advantages, mask), returns
