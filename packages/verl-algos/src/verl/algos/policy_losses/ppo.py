"""The PPO clipped objective (with DAPO's asymmetric clip and dual-clip) and GPG's plain policy gradient."""

from __future__ import annotations

import torch

from verl.algos.losses.aggregation import LossNormalizer, agg_loss, micro_mean
from verl.algos.masked import masked_mean
from verl.algos.options import option
from verl.algos.policy_losses.registry import apply_is_weights, clip_ratios, register_policy_loss


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    normalizer: LossNormalizer | None = None,
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip (Schulman et al. 2017, arXiv:1707.06347) with decoupled clip ranges (DAPO's
    clip-higher, Yu et al. 2025, arXiv:2503.14476) and dual-clip (Ye et al. 2020, arXiv:1912.09729).

    Per token, with ratio rho = exp(log_prob - old_log_prob) (log-ratio clamped to +-20)::

        l = max(-A * rho, -A * clip(rho, 1 - clip_ratio_low, 1 + clip_ratio_high))
        if A < 0:  l = min(l, -A * clip_ratio_c)          (dual-clip bounds the loss of bad actions)

    Metrics: ``actor/pg_clipfrac`` (share of tokens where the clipped term is the max),
    ``actor/pg_clipfrac_lower`` (share where dual-clip binds), ``actor/ppo_kl`` (mean of
    old_log_prob - log_prob). Config: ``clip_ratio`` (0.2), ``clip_ratio_low``, ``clip_ratio_high``,
    ``clip_ratio_c`` (3.0, must exceed 1).
    """
    low, high = clip_ratios(config)
    clip_c = float(option(config, "clip_ratio_c", 3.0))
    if clip_c <= 1.0:
        raise ValueError(f"clip_ratio_c={clip_c}: the dual-clip bound must be greater than 1.0 (verl's default is 3.0)")
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    clip_max = torch.maximum(unclipped, clipped)
    dual = -advantages * clip_c
    negative = advantages < 0
    pg_losses = torch.where(negative, torch.minimum(clip_max, dual), clip_max)
    pg_losses = apply_is_weights(pg_losses, rollout_is_weights)
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, normalizer)
    with torch.no_grad():
        metrics = {
            "actor/pg_loss": micro_mean(pg_losses, response_mask, loss_agg_mode),
            "actor/pg_clipfrac": float(masked_mean((clipped > unclipped).float(), response_mask)),
            "actor/pg_clipfrac_lower": float(masked_mean(((clip_max > dual) & negative).float(), response_mask)),
            "actor/ppo_kl": float(masked_mean(-log_ratio, response_mask)),
        }
    return loss, metrics


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    normalizer: LossNormalizer | None = None,
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GPG (Chu et al. 2025, arXiv:2504.02546): the plain policy gradient, no ratio and no clipping::

        l = -A * log_prob

    Pair it with ``adv_estimator=gpg``. Clip metrics are 0; ``actor/ppo_kl`` is still reported.
    """
    pg_losses = -advantages * log_prob
    pg_losses = apply_is_weights(pg_losses, rollout_is_weights)
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, normalizer)
    with torch.no_grad():
        metrics = {
            "actor/pg_loss": micro_mean(pg_losses, response_mask, loss_agg_mode),
            "actor/pg_clipfrac": 0.0,
            "actor/pg_clipfrac_lower": 0.0,
            "actor/ppo_kl": float(masked_mean(old_log_prob - log_prob, response_mask)),
        }
    return loss, metrics
