"""SAPO: a smooth, temperature-controlled gate on the importance ratio instead of a hard clip."""

from __future__ import annotations

import logging

import torch

from verl.algos.losses.aggregation import LossNormalizer, agg_loss, micro_mean
from verl.algos.masked import masked_mean
from verl.algos.options import option
from verl.algos.policy_losses.registry import apply_is_weights, register_policy_loss

logger = logging.getLogger(__name__)
_warned_agg_mode = False


def sapo_gate(ratio: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """f(r) = sigmoid(tau (r - 1)) * 4 / tau: value 2/tau and slope 1 at r = 1 (the plain policy
    gradient on-policy), flattening out as r leaves 1, more sharply for a larger tau."""
    return torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)


@register_policy_loss("sapo")
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str = "seq-mean-token-mean",
    normalizer: LossNormalizer | None = None,
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """SAPO (Gao et al. 2025, "Soft Adaptive Policy Optimization", arXiv:2511.20347).

    Per token, with rho = exp(log_prob - old_log_prob) (log-ratio clamped to +-20)::

        tau = tau_pos if A > 0 else tau_neg
        l   = -A * sigmoid(tau (rho - 1)) * 4 / tau

    The gate's gradient decays smoothly as rho moves away from 1 instead of dropping to zero at a clip
    boundary; a larger ``tau_neg`` damps negative updates faster (they are the less stable ones). As in
    verl the objective averages per sequence, so the aggregation is always ``seq-mean-token-mean`` (a
    different ``loss_agg_mode`` is overridden, with a one-time warning). Config (verl's keys, on the
    actor): ``tau_pos`` (1.0), ``tau_neg`` (1.05). Clip metrics are 0.
    """
    global _warned_agg_mode
    if loss_agg_mode != "seq-mean-token-mean" and not _warned_agg_mode:
        logger.warning(
            "policy_loss.loss_mode=sapo aggregates with seq-mean-token-mean; ignoring loss_agg_mode=%s", loss_agg_mode
        )
        _warned_agg_mode = True
    tau_pos = float(option(config, "tau_pos", 1.0))
    tau_neg = float(option(config, "tau_neg", 1.05))
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"sapo needs tau_pos > 0 and tau_neg > 0, got tau_pos={tau_pos}, tau_neg={tau_neg}")
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    tau = torch.where(advantages > 0, tau_pos, tau_neg).to(ratio.dtype)
    pg_losses = apply_is_weights(-sapo_gate(ratio, tau) * advantages, rollout_is_weights)
    loss = agg_loss(pg_losses, response_mask, "seq-mean-token-mean", normalizer)
    with torch.no_grad():
        metrics = {
            "actor/pg_loss": micro_mean(pg_losses, response_mask, "seq-mean-token-mean"),
            "actor/pg_clipfrac": 0.0,
            "actor/pg_clipfrac_lower": 0.0,
            "actor/ppo_kl": float(masked_mean(-log_ratio, response_mask)),
        }
    return loss, metrics
