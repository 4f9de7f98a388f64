"""CISPO: the policy gradient weighted by a clipped, stop-gradient importance ratio."""

from __future__ import annotations

import torch

from verl.algos.losses.aggregation import LossNormalizer, agg_loss, micro_mean
from verl.algos.masked import masked_mean
from verl.algos.policy_losses.registry import apply_is_weights, clip_ratios, register_policy_loss


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
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
    """CISPO (MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning
    Attention", arXiv:2506.13585).

    PPO's clip zeroes the gradient of tokens whose ratio left the trust region, and those are often the
    rare, decisive reasoning tokens. CISPO clips the importance *weight* instead and keeps every
    token's gradient::

        rho = exp(log_prob - old_log_prob)          (log-ratio clamped to +-20)
        l   = -sg[clip(rho, 1 - clip_ratio_low, 1 + clip_ratio_high)] * A * log_prob

    so the gradient is -clip(rho) * A * grad(log_prob). ``actor/pg_clipfrac`` is the share of tokens
    whose ratio was clipped. Config: ``clip_ratio``/``clip_ratio_low``/``clip_ratio_high`` (verl's keys;
    the paper clips only from above, e.g. a large ``clip_ratio_low``).
    """
    low, high = clip_ratios(config)
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    clipped_ratio = torch.clamp(ratio, 1 - low, 1 + high).detach()
    pg_losses = apply_is_weights(-clipped_ratio * advantages * log_prob, rollout_is_weights)
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, normalizer)
    with torch.no_grad():
        metrics = {
            "actor/pg_loss": micro_mean(pg_losses, response_mask, loss_agg_mode),
            "actor/pg_clipfrac": float(masked_mean((ratio != clipped_ratio).float(), response_mask)),
            "actor/pg_clipfrac_lower": 0.0,
            "actor/ppo_kl": float(masked_mean(-log_ratio, response_mask)),
        }
    return loss, metrics
