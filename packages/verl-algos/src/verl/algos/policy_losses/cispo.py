"""CISPO: the policy gradient weighted by a clipped, stop-gradient importance ratio."""

from __future__ import annotations

import torch

from verl.algos.policy_losses.config import ActorLossConfig
from verl.algos.policy_losses.registry import PolicyLossInputs, TokenLoss, register_token_loss


@register_token_loss("cispo")
def compute_policy_loss_cispo(x: PolicyLossInputs, config: ActorLossConfig) -> TokenLoss:
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
    low, high = config.clip_ratios
    clipped_ratio = torch.clamp(x.ratio, 1 - low, 1 + high).detach()
    return TokenLoss(
        pg_losses=-clipped_ratio * x.advantages * x.log_prob, clipped=x.ratio != clipped_ratio, kl=-x.log_ratio
    )
