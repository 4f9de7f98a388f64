"""GMPO (``loss_mode=geo_mean``): PPO on the geometric mean of a sequence's token ratios."""

from __future__ import annotations

import torch

from verl.algos.data.masked import as_float_mask, masked_mean
from verl.algos.losses.aggregation import agg_seq_loss
from verl.algos.policy_losses.config import ActorLossConfig
from verl.algos.policy_losses.registry import (
    Aggregation,
    PolicyLossInputs,
    aggregation_of,
    register_aggregating_loss,
)


def _per_sequence_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)


@register_aggregating_loss("geo_mean")
def compute_policy_loss_geo_mean(
    inputs: PolicyLossInputs, config: ActorLossConfig, aggregation: Aggregation
) -> tuple[torch.Tensor, dict[str, float]]:
    """GMPO (Zhao et al. 2025, "Geometric-Mean Policy Optimization", arXiv:2507.20673).

    The arithmetic mean of token ratios that GRPO optimizes is dragged by outlier tokens; GMPO
    maximizes their geometric mean, clipped per token in log space (wider ranges are stable)::

        d_t   = log_prob_t - old_log_prob_t
        d'_t  = sgn(A) * min(sgn(A) d_t, sgn(A) clip(d_t, -clip_ratio_low, clip_ratio_high))
        l_i   = -A_i * exp(mean_t d'_t)                (A_i: the sequence's mean advantage)

    averaged over the non-empty sequences of the global mini-batch (``loss_agg_mode`` does not apply,
    as in verl; a different one is noted once). With rollout-correction weights, each sequence is
    weighted by the geometric mean of its token weights. ``actor/pg_clipfrac`` counts clipped tokens
    with A > 0, ``actor/pg_clipfrac_lower`` those with A < 0. Config: ``clip_ratio``,
    ``clip_ratio_low``, ``clip_ratio_high`` (log-space bounds; the paper uses e^-0.4 .. e^0.4).
    """
    aggregation_of("geo_mean", "token-mean", aggregation.mode)  # per sequence, whatever was asked (warned once)
    low, high = config.clip_ratios
    log_prob, advantages, response_mask = inputs.log_prob, inputs.advantages, inputs.response_mask
    mask = as_float_mask(response_mask, log_prob)
    log_ratio = log_prob - inputs.old_log_prob
    sign = torch.sign(advantages)
    clamped = torch.clamp(log_ratio, -low, high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clamped)
    seq_ratio = torch.exp(_per_sequence_mean(pessimistic, mask))
    seq_advantage = _per_sequence_mean(advantages, mask)
    seq_losses = -seq_advantage * seq_ratio
    if aggregation.rollout_is_weights is not None:
        log_weights = torch.log(aggregation.rollout_is_weights.detach() + 1e-10)
        seq_losses = seq_losses * torch.exp(_per_sequence_mean(log_weights, mask))
    loss = agg_seq_loss(seq_losses, response_mask, aggregation.normalizer)
    with torch.no_grad():
        clipped = (log_ratio != clamped).float()
        metrics = {
            "actor/pg_loss": float(agg_seq_loss(seq_losses.detach(), response_mask)),
            "actor/pg_clipfrac": float(masked_mean(clipped * (advantages > 0), response_mask)),
            "actor/pg_clipfrac_lower": float(masked_mean(clipped * (advantages < 0), response_mask)),
            "actor/ppo_kl": float(masked_mean(-log_ratio, response_mask)),
        }
    return loss, metrics
