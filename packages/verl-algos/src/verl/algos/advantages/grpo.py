"""Group-normalized outcome advantages: GRPO (and Dr.GRPO) and GRPO for pass@k."""

from __future__ import annotations

from typing import Any

import torch

from verl.algos.advantages.config import AdvantageConfig
from verl.algos.advantages.registry import EstimatorInputs, register_outcome_estimator


def _norm_by_std(config: AdvantageConfig, kw: dict[str, Any]) -> bool:
    """verl passes ``norm_adv_by_std_in_grpo`` as a keyword argument; the config's value otherwise."""
    if kw.get("norm_adv_by_std_in_grpo") is not None:
        return bool(kw["norm_adv_by_std_in_grpo"])
    return config.norm_adv_by_std_in_grpo


@register_outcome_estimator(["grpo", "grpo_vectorized"])
def compute_grpo_outcome_advantage(x: EstimatorInputs, config: AdvantageConfig, **kw) -> torch.Tensor:
    """GRPO (Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300), outcome supervision.

    For response i of a group G (the responses to one prompt) with score s_i = sum_t r_{i,t}::

        A_i = (s_i - mean_G(s)) / (std_G(s) + epsilon)     (std with Bessel's correction)

    broadcast to every valid token. ``norm_adv_by_std_in_grpo=False`` drops the division, which is
    Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783): A_i = s_i - mean.
    A group whose scores are all equal gets A = 0. A group of one response has no baseline: as in
    verl its mean is taken as 0 and its std as 1, so A = s / (1 + epsilon).
    Config: ``norm_adv_by_std_in_grpo`` (default True). ``epsilon`` (default 1e-6) is a keyword argument,
    as in verl's function; no config key sets it.
    ``grpo_vectorized`` is verl's name for a vectorized implementation of the same estimator; here it is
    an alias (verl's floors the group variance at epsilon, which only matters for groups whose spread is
    below 1e-3).
    """
    eps = float(kw.get("epsilon", 1e-6))
    by_std = _norm_by_std(config, kw)
    adv = torch.zeros_like(x.scores)
    for rows in x.groups:
        s = x.scores[rows]
        if len(rows) == 1:
            mean, std = torch.zeros_like(s[0]), torch.ones_like(s[0])
        else:
            mean, std = s.mean(), s.std()
        adv[rows] = (s - mean) / (std + eps) if by_std else s - mean
    return adv


@register_outcome_estimator("grpo_passk")
def compute_grpo_passk_outcome_advantage(x: EstimatorInputs, config: AdvantageConfig, **kw) -> torch.Tensor:
    """Pass@k training (Chen et al. 2025, "Pass@k Training for Adaptively Balancing Exploration and
    Exploitation", arXiv:2503.19595 as cited by verl), GRPO style.

    Only the best response of a group is credited, by its margin over the runner-up::

        A_{argmax} = (s_max - s_second) / (std_G(s) + epsilon)     (others: 0)

    without the division when ``norm_adv_by_std_in_grpo=False``. Ties go to the first best response
    (margin 0). A group of one response has no runner-up and gets A = 0 (verl raises here; a
    dynamic-sampling batch may legitimately hold such a group).
    """
    eps = float(kw.get("epsilon", 1e-6))
    by_std = _norm_by_std(config, kw)
    adv = torch.zeros_like(x.scores)
    for rows in x.groups:
        if len(rows) < 2:
            continue
        s = x.scores[rows]
        top, top_idx = torch.topk(s, 2)
        margin = top[0] - top[1]
        if by_std:
            margin = margin / (s.std() + eps)
        adv[rows[int(top_idx[0])]] = margin
    return adv
