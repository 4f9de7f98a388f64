"""The optimal token baseline (``adv_estimator=optimal_token_baseline``): a per-position baseline that
minimizes the variance of the policy gradient, weighted by each path's accumulated score-function energy."""

from __future__ import annotations

import torch

from verl.algos.advantages.config import AdvantageConfig
from verl.algos.advantages.registry import EstimatorInputs, register_token_estimator, returns_to_go

#: Keeps an all-zero-energy position finite (verl's default for this estimator).
_EPSILON = 1e-8


@register_token_estimator(
    "optimal_token_baseline",
    needs=("index", "old_log_probs", "sum_pi_squared"),
    optional=("rollout_is_weights",),
)
def compute_optimal_token_baseline_advantage(
    x: EstimatorInputs,
    config: AdvantageConfig,
    old_log_probs: torch.Tensor | None = None,
    sum_pi_squared: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    **kw,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimal token baseline (verl's OTB).

    The variance-minimizing baseline of a policy gradient weights each sample's return by the squared
    norm of its score function. For a softmax policy the squared norm of grad log pi(y_t) with respect to
    the logits is ||e_{y_t} - pi||^2 = 1 - 2 pi_t + sum_v pi_v^2, so with the path energy accumulated up
    to position t::

        G_{i,t} = sum_{k >= t} r_{i,k}                             (return to go, valid tokens)
        W_{i,t} = sum_{k <= t} (1 - 2 pi_{i,k} + sum_v pi_{i,k,v}^2) [* w_{i,k}^2 with rollout IS]
        B_t     = sum_i G_{i,t} W_{i,t} / (sum_i W_{i,t} + epsilon)   (over the group's valid rows at t)
        A_{i,t} = G_{i,t} - B_t

    with pi_t = exp(old_log_probs) (the training policy) and sum_pi_squared from the actor's forward
    (the trainer asks for it; verl's ``actor.calculate_sum_pi_squared``). A group of one response has
    no baseline (A = G). Returns are G. verl's ``handle_zero_tail`` (off by default for this estimator,
    and set by no config key) is not offered.
    """
    if old_log_probs is None or sum_pi_squared is None:
        raise ValueError(
            "adv_estimator='optimal_token_baseline' needs 'old_log_probs' and 'sum_pi_squared' from the actor's "
            "log-prob pass (the trainer requests them for this estimator)"
        )
    mask = x.mask
    returns = returns_to_go(x.token_level_rewards, mask)
    energy = 1.0 - 2.0 * torch.exp(old_log_probs.to(returns.dtype)) + sum_pi_squared.to(returns.dtype)
    if rollout_is_weights is not None:
        energy = energy * rollout_is_weights.to(returns.dtype).square()
    path_energy = (energy * mask).cumsum(dim=-1)
    baselines = torch.zeros_like(returns)
    for rows in x.groups:
        if len(rows) < 2:
            continue
        w = path_energy[rows] * mask[rows]
        baselines[rows] = ((returns[rows] * w).sum(dim=0) / (w.sum(dim=0) + _EPSILON)).unsqueeze(0)
    advantages = (returns - baselines) * mask
    return advantages, returns
