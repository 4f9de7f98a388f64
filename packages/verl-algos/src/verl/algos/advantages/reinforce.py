"""REINFORCE-family advantages: REINFORCE++ (with and without a group baseline) and ReMax."""

from __future__ import annotations

import torch

from verl.algos.advantages.config import AdvantageConfig
from verl.algos.advantages.registry import EstimatorInputs, register_token_estimator, returns_to_go
from verl.algos.data.masked import masked_whiten

Advantages = tuple[torch.Tensor, torch.Tensor]


@register_token_estimator("reinforce_plus_plus")
def compute_reinforce_plus_plus_outcome_advantage(x: EstimatorInputs, config: AdvantageConfig, **kw) -> Advantages:
    """REINFORCE++ (Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large
    Language Models", arXiv:2501.03262).

    Discounted return-to-go over the valid tokens, then whitened over the whole batch (the global
    advantage normalization that replaces a critic)::

        G_t = r_t + gamma * G_{t+1}           (the sum stops at a masked token)
        A_t = (G_t - mean(G)) / std(G)        (statistics over all valid tokens of the batch)

    Returns are G. Config: ``gamma`` (default 1.0).
    """
    rewards, mask = x.token_level_rewards, x.mask
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = (rewards[:, t] + config.gamma * running) * mask[:, t]
        returns[:, t] = running
    return masked_whiten(returns, mask), returns


@register_token_estimator("reinforce_plus_plus_baseline", needs=("index",))
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    x: EstimatorInputs, config: AdvantageConfig, **kw
) -> Advantages:
    """REINFORCE++ with a group-mean baseline (arXiv:2501.03262, "REINFORCE++-baseline").

    Subtract the group's mean score, then whiten over all valid tokens of the batch::

        a_i = s_i - mean_G(s)   (groups of one: baseline 0, as in verl)
        A_{i,t} = (a_i - mean(a)) / std(a)   over every valid token (i, t) of the batch
    """
    centered = x.scores.clone()
    for rows in x.groups:
        if len(rows) > 1:
            centered[rows] = x.scores[rows] - x.scores[rows].mean()
    adv = masked_whiten(centered.unsqueeze(-1) * x.mask, x.mask)
    return adv, adv


@register_token_estimator("remax", needs=("reward_baselines",))
def compute_remax_outcome_advantage(
    x: EstimatorInputs, config: AdvantageConfig, reward_baselines: torch.Tensor | None = None, **kw
) -> Advantages:
    """ReMax (Li et al. 2024, "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method
    for Aligning Large Language Models", arXiv:2310.10505).

    The baseline is the reward of the *greedy* response to the same prompt (``reward_baselines``,
    one value per row; see :func:`verl.algos.advantages.apply.greedy_reward_baselines`)::

        G_t = sum_{k >= t} r_k ,     A_t = G_t - b_greedy      (valid tokens)
    """
    if reward_baselines is None:
        raise ValueError(
            "adv_estimator='remax' needs 'reward_baselines' (the reward of a greedy response per prompt); "
            "generate greedily and use verl.algos.advantages.greedy_reward_baselines"
        )
    returns = returns_to_go(x.token_level_rewards, x.mask)
    adv = returns - reward_baselines.to(returns.dtype).reshape(-1, 1) * x.mask
    return adv, returns
