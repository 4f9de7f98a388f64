"""SAPO: a smooth, temperature-controlled gate on the importance ratio instead of a hard clip."""

from __future__ import annotations

import torch

from verl.algos.policy_losses.config import ActorLossConfig
from verl.algos.policy_losses.registry import PolicyLossInputs, TokenLoss, register_token_loss


def sapo_gate(ratio: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """f(r) = sigmoid(tau (r - 1)) * 4 / tau: value 2/tau and slope 1 at r = 1 (the plain policy
    gradient on-policy), flattening out as r leaves 1, more sharply for a larger tau."""
    return torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)


@register_token_loss("sapo", aggregation="seq-mean-token-mean")
def compute_policy_loss_sapo(x: PolicyLossInputs, config: ActorLossConfig) -> TokenLoss:
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
    tau = torch.where(x.advantages > 0, config.tau_pos, config.tau_neg).to(x.ratio.dtype)
    return TokenLoss(pg_losses=-sapo_gate(x.ratio, tau) * x.advantages, kl=-x.log_ratio)
